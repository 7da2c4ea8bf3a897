"""Checkpoint dtypes: compact bfloat16 storage, and the dtype a checkpoint runs in by default.

Why: the project ships its small trained models inside the repository (a fresh clone must run the demo and
the benchmarks with nothing downloaded), so every byte on disk counts; bfloat16 halves them. What ships is
the *rounded* model: drafters and measurements use the loaded weights, never the float32 originals.

* :func:`resolve_dtype` / :func:`stored_dtype`: what ``dtype="auto"`` means in mmspec: the dtype the
  checkpoint's weights are *stored* in (read from the safetensors headers), as nobody runs a bf16 VLM in
  float32 on hardware that computes in bf16. transformers' own ``"auto"`` reads ``config.json`` instead,
  and a config may say float32 over bf16 weights (the bundled ones do, on purpose: see next point). The
  one exception is a device that would only *emulate* a half-width dtype: a CPU without AVX512-BF16 / AMX
  runs bf16 matmuls 3-8x slower than float32 (measured on a 2-core AVX2 EPYC: a 256x384x1024 linear 42 ms
  against 9.4 ms; the testbed target's prefill 1.65 s against 0.34 s), so there ``"auto"`` runs the
  checkpoint in float32 and says so (:func:`dtype_note`); ``"bfloat16"`` still forces it.
* :func:`save_hf_compact`: ``save_pretrained`` of a transformers model with its floating-point weights in
  ``dtype`` and ``config.json`` saying float32, so a plain transformers ``from_pretrained`` (training
  scripts warm-starting from a shipped model) upcasts on load, while mmspec's loaders run it in bf16.
* :func:`save_state_compact`: the same for a plain ``state_dict`` written as safetensors (``load_state_dict``
  into float32 parameters casts back).
* :func:`copy_training_files`: the training log and config beside the shipped weights.

Example:
    >>> import tempfile, torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> m = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    ...                                  num_attention_heads=2, num_key_value_heads=1))
    >>> path = tempfile.mkdtemp()
    >>> save_hf_compact(m, path)
    >>> LlamaForCausalLM.from_pretrained(path).dtype
    torch.float32
"""

from __future__ import annotations

import json
import os
import shutil

import torch

from .errors import InvalidInputError

__all__ = ["save_hf_compact", "save_state_compact", "copy_training_files", "resolve_dtype", "stored_dtype",
           "native_dtype", "dtype_note", "DTYPE_CHOICES"]

DTYPE_CHOICES = ("auto", "bfloat16", "float16", "float32")
"""The dtype names the command line accepts (``auto``: the checkpoint's stored dtype)."""

_ALIASES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
            "half": torch.float16, "float32": torch.float32, "fp32": torch.float32, "float": torch.float32}
_SAFETENSORS_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64}


def _safetensors_files(path: str) -> list:
    """The weight files of a checkpoint folder (the index's shards, or every ``*.safetensors`` in it)."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            return sorted({os.path.join(path, v) for v in json.load(f).get("weight_map", {}).values()})
    return sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".safetensors"))


def stored_dtype(path) -> "torch.dtype | None":
    """The floating-point dtype holding most of the parameters stored under ``path`` (``None`` if unknown).

    Reads only the safetensors headers (no weights). A folder with several weight files (a VLA's backbone and
    expert, shards) counts them all; a path that is not a local folder, or holds no safetensors, gives
    ``None``.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> save_state_compact({"w": torch.ones(4), "b": torch.ones(1)}, os.path.join(d, "x.safetensors"), torch.bfloat16)
        >>> stored_dtype(d)
        torch.bfloat16
    """
    path = os.path.expanduser(os.fspath(path))
    if not os.path.isdir(path):
        return None
    counts: dict = {}
    for file in _safetensors_files(path):
        try:
            with open(file, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                if not 0 < n <= min(os.path.getsize(file) - 8, 100 << 20):
                    raise ValueError(f"header length {n}")
                header = json.loads(f.read(n))
            if not isinstance(header, dict):
                raise ValueError("header is not a JSON object")
        except (OSError, ValueError, UnicodeDecodeError) as e:
            raise InvalidInputError(f"{file} is not a readable safetensors file ({e}); the checkpoint is damaged "
                                    "or incomplete") from None
        for name, info in header.items():
            dt = _SAFETENSORS_DTYPES.get(info.get("dtype")) if isinstance(info, dict) else None
            if dt is not None:
                numel = 1
                for d in info.get("shape", []):
                    numel *= int(d)
                counts[dt] = counts.get(dt, 0) + numel
    return max(counts, key=counts.get) if counts else None


def native_dtype(dtype, device="cpu") -> bool:
    """Whether ``device`` computes in ``dtype`` natively (float32 always; bf16/fp16 on CUDA when supported,
    on a CPU only with AVX512-BF16 or AMX tiles for bf16, AMX-FP16 for fp16: elsewhere torch emulates them).

    Example:
        >>> native_dtype(torch.float32), native_dtype(torch.float32, "cuda")
        (True, True)
    """
    device = torch.device(device)
    if dtype not in (torch.bfloat16, torch.float16):
        return True
    if device.type == "cuda":  # pre-Ampere GPUs emulate bf16: not native
        if dtype == torch.float16:
            return True
        with torch.cuda.device(device):
            return torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type != "cpu":
        return True  # other accelerators: trust the checkpoint
    cpu = torch.cpu
    try:
        if dtype == torch.bfloat16:
            return bool(cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported())
        return bool(cpu._is_amx_fp16_supported())
    except AttributeError:  # a torch without these probes: read the CPU's flags
        try:
            with open("/proc/cpuinfo") as f:
                flags = next((ln for ln in f if ln.startswith("flags")), "").split()
        except OSError:
            return False
        want = {"avx512_bf16", "amx_bf16"} if dtype == torch.bfloat16 else {"amx_fp16", "avx512_fp16"}
        return bool(want & set(flags))


def dtype_note(requested, path, device="cpu") -> str | None:
    """Why ``"auto"`` did not run ``path`` in its stored dtype on ``device`` (``None`` when it did, or when a
    dtype was named): the sentence benches and the demo print beside their figures.

    Example:
        >>> dtype_note("float32", "/any")
    """
    if not (requested is None or (isinstance(requested, str) and requested.strip().lower() == "auto")):
        return None
    stored = stored_dtype(path) if path is not None else None
    if stored is None or native_dtype(stored, device):
        return None
    name = str(stored).removeprefix("torch.")
    return (f"stored in {name}, run in float32: this {torch.device(device).type.upper()} has no native {name} "
            f"(capability {torch.backends.cpu.get_cpu_capability()}), where {name} is emulated and several "
            f"times slower; --dtype {name} forces it")


def resolve_dtype(dtype, path=None, device="cpu"):
    """Turn a user's dtype (``None``/``"auto"``, a name, or a ``torch.dtype``) into what to load ``path`` with.

    ``None`` and ``"auto"`` mean the checkpoint's stored dtype (:func:`stored_dtype`), unless ``device``
    would only emulate it (:func:`native_dtype`: then float32, see :func:`dtype_note`); where the stored
    dtype cannot be read (a hub id, ``.bin`` weights) the string ``"auto"`` is returned, so transformers
    falls back to its own rule (the config's dtype).

    Raises:
        InvalidInputError: an unknown dtype name (the message lists the accepted ones).

    Example:
        >>> resolve_dtype("bf16"), resolve_dtype(torch.float32), resolve_dtype("auto", "/no/such/dir")
        (torch.bfloat16, torch.float32, 'auto')
    """

    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or (isinstance(dtype, str) and dtype.strip().lower() == "auto"):
        stored = stored_dtype(path) if path is not None else None
        if stored is None:
            return "auto"
        return stored if native_dtype(stored, device) else torch.float32
    if isinstance(dtype, str):
        name = dtype.strip().lower().removeprefix("torch.")
        if name in _ALIASES:
            return _ALIASES[name]
    raise InvalidInputError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPE_CHOICES)} (or a torch.dtype)")


def save_hf_compact(model, path: str, dtype=torch.bfloat16) -> None:
    """``model.save_pretrained(path)`` with floating weights in ``dtype`` and a float32 config; ``model`` is
    left as it was."""
    import copy

    copy.deepcopy(model).to(dtype).save_pretrained(path)  # a round trip through dtype would round ``model``
    config_path = os.path.join(path, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    for sub in [config] + [v for v in config.values() if isinstance(v, dict)]:
        if "dtype" in sub:
            sub["dtype"] = "float32"
        if "torch_dtype" in sub:
            sub["torch_dtype"] = "float32"
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)


def save_state_compact(state_dict: dict, file: str, dtype=None) -> None:
    """Write ``state_dict`` as safetensors at ``file``, floating tensors in ``dtype`` (``None``: as they are).

    Example:
        >>> import tempfile
        >>> from safetensors.torch import load_file
        >>> f = os.path.join(tempfile.mkdtemp(), "w.safetensors")
        >>> save_state_compact({"w": torch.ones(2), "i": torch.arange(2)}, f, torch.bfloat16)
        >>> {k: v.dtype for k, v in sorted(load_file(f).items())}
        {'i': torch.int64, 'w': torch.bfloat16}
    """
    from safetensors.torch import save_file

    save_file({k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).detach().contiguous().cpu()
               for k, v in state_dict.items()}, file)
    user_file_mode(file)


def copy_training_files(src: str, out: str, names=("train_log.jsonl", "train_config.json")) -> None:
    """Copy the training records that exist in ``src`` to ``out`` (what shipped weights are documented by)."""
    for name in names:
        if os.path.isfile(os.path.join(src, name)):
            shutil.copy(os.path.join(src, name), os.path.join(out, name))


_FILE_HASHES: dict = {}  # (realpath, size, mtime_ns) -> sha256: one read per file per process


def file_sha256(path: str) -> str:
    """The SHA-256 hex digest of the file at ``path``, read in 1 MB blocks and remembered per (real path, size,
    modification time), so a weights file that several checks fingerprint is read once per process.

    Example:
        >>> import tempfile
        >>> f = os.path.join(tempfile.mkdtemp(), "w.bin")
        >>> _ = open(f, "wb").write(b"weights")
        >>> file_sha256(f)[:16]
        '9a129038d9a00aed'
    """
    import hashlib

    real = os.path.realpath(path)
    st = os.stat(real)
    key = (real, st.st_size, st.st_mtime_ns)
    if key not in _FILE_HASHES:
        h = hashlib.sha256()
        with open(real, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _FILE_HASHES[key] = h.hexdigest()
    return _FILE_HASHES[key]


def user_file_mode(path: str) -> None:
    """Give ``path`` the permissions any file the user writes gets (``0o666`` less the umask: 0644 by default).

    Why: safetensors writes through a private temporary file and leaves weights at 0600, so a trained drafter
    or a data shard could not be read by a teammate, a web server or another container user.

    Example:
        >>> import tempfile
        >>> from safetensors.torch import save_file
        >>> f = os.path.join(tempfile.mkdtemp(), "w.safetensors")
        >>> save_file({"w": torch.ones(1)}, f)
        >>> user_file_mode(f)
        >>> mask = os.umask(0); _ = os.umask(mask)
        >>> oct(os.stat(f).st_mode & 0o777) == oct(0o666 & ~mask)
        True
    """
    mask = os.umask(0)
    os.umask(mask)  # reading the umask means setting it; put it straight back
    os.chmod(path, 0o666 & ~mask)
