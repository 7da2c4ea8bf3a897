"""Export a trained head to a format another serving engine loads: ``mmspec export HEAD --format vllm-eagle3``.

Why: a head trained with ``mmspec train`` should serve where one process is not enough. vLLM (tensor and pipeline
parallel, continuous batching, an OpenAI-compatible server) loads EAGLE-3 heads; this writes an EAGLE head trained in
the ``"eagle3"`` layout (``mmspec train --kind eagle --options '{"layout": "eagle3", "draft_vocab_size": 8192}'``)
as one.

Format: the **speculators** checkpoint format (``speculators_model_type: "eagle3"``), not vLLM's bare EAGLE-3 config,
because (1) it names the target the head was trained for (``speculators_config.verifier.name_or_path``), so
``vllm serve HEAD`` alone finds the target and the head cannot drift from it silently; (2) it is a versioned,
documented schema (the ``speculators`` package, whose ``Eagle3SpeculatorConfig`` has every flag this head needs:
``norm_before_fc``, ``norm_before_residual``, ``eagle_aux_hidden_state_layer_ids``, ``draft_vocab_size``); (3) vLLM
converts it in a few lines we can read (``vllm/transformers_utils/configs/speculators/algos.py``, ``update_eagle3``),
into the same ``Eagle3LlamaForCausalLM`` its native EAGLE-3 configs build.

What is written (names as the speculators package saves them; vLLM's loader,
``vllm/model_executor/models/llama_eagle3.py``, maps ``layers.0.*`` / ``midlayer.*`` and stacks q/k/v):

- ``fc.weight [H, 3H]`` and ``input_norm.weight [3H]``: the fusion of the three target layers (mmspec's
  ``fuse`` / ``fuse_norm``; ``norm_before_fc``);
- ``layers.0.*``: the decoder layer (``input_layernorm`` over the token embedding, ``hidden_norm`` over the feature,
  ``self_attn.{q,k,v}_proj [H, 2H]``, ``o_proj``, ``post_attention_layernorm``, ``mlp.{gate,up,down}_proj``);
- ``norm.weight``; with a reduced draft vocabulary ``lm_head.weight [D, H]`` (the target's LM head rows at the
  head's ``draft_ids``, taken from the target at export time, so the head mmspec ships stays small), ``d2t [D]``
  (``draft_ids - arange(D)``) and ``t2d [V]`` (bool). Without one, no ``lm_head`` and vLLM shares the target's.
  Never ``embed_tokens``: vLLM shares the target's embeddings with an EAGLE head that has none.

The config's extra ``mmspec`` block keeps the head's target fingerprint; vLLM ignores it.

Example:
    $ mmspec export runs/head --format vllm-eagle3 --target ~/.cache/mmspec/smollm2-135m-instruct-b179c9523d0e \\
          --out runs/head-vllm
    $ vllm serve TARGET --speculative-config '{"method": "eagle3", "model": "runs/head-vllm", "num_speculative_tokens": 3}'
"""

from __future__ import annotations

import json
import os

import torch

from .errors import InvalidInputError

__all__ = ["FORMATS", "export_head", "vllm_eagle3_tensors", "vllm_eagle3_config", "load_target_for_export"]

FORMATS = ("vllm-eagle3",)
SPECULATORS_VERSION = "0.9.0"
"""The speculators release whose ``Eagle3SpeculatorConfig`` the written config follows."""


def _check_exportable(drafter, target_config) -> None:
    """Refuse what vLLM's EAGLE-3 loader cannot load, or would load as something else.

    Example:
        >>> # _check_exportable(EagleDrafter.from_pretrained(head, target=lm), lm.config)  # raises InvalidInputError
    """
    if drafter.kind != "eagle":
        raise InvalidInputError(f"a {drafter.kind!r} head cannot be exported as vllm-eagle3: vLLM's EAGLE-3 loader "
                                "takes mmspec's EAGLE head only (mmspec train --kind eagle)")
    if drafter.layout != "eagle3":
        raise InvalidInputError("this EAGLE head has mmspec's own layout (a Linear(2H -> H) over [embedding; feature] "
                                "before the layer), which vLLM's EAGLE-3 layer does not have; train it with "
                                "--options '{\"layout\": \"eagle3\"}' to export it")
    ids = list(drafter.layer_ids)
    n = int(target_config.num_hidden_layers)
    if ids != sorted(set(ids)):
        raise InvalidInputError(f"layer_ids {ids}: vLLM collects the auxiliary states once per layer, in layer order; "
                                "the head must read three distinct layers in increasing order")
    if any(not 0 <= i < n for i in ids):
        raise InvalidInputError(f"layer_ids {ids}: vLLM's auxiliary state k is the input of decoder layer k (0..{n - 1}); "
                                f"hidden_states[{n}] is after the final norm in transformers, which vLLM never hands "
                                "to a head")


def _check_speculative_tokens(k) -> None:
    """``num_speculative_tokens`` is ``None`` (the head's own draft depth) or a positive integer."""
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise InvalidInputError(f"num_speculative_tokens must be a positive integer (got {k!r})")


def vllm_eagle3_tensors(drafter) -> dict:
    """The head's tensors under the names vLLM's EAGLE-3 loader reads (see the module docstring), float32 on the
    CPU; ``d2t`` / ``t2d`` as int64 / bool. The drafter must hold the target's LM head (loaded against it).

    Example:
        >>> # t = vllm_eagle3_tensors(EagleDrafter.from_pretrained(head, target=lm))
        >>> # t["fc.weight"].shape == (576, 3 * 576); t["d2t"][i] + i == the target id of draft token i
    """
    sd = {k: v.detach().cpu() for k, v in drafter.state_dict().items()}
    out = {"fc.weight": sd["fuse.weight"], "input_norm.weight": sd["fuse_norm.weight"], "norm.weight": sd["norm.weight"]}
    layer = {"input_layernorm": "input_layernorm", "hidden_norm": "hidden_norm",
             "post_attention_layernorm": "post_attention_layernorm", "self_attn.q_proj": "q_proj",
             "self_attn.k_proj": "k_proj", "self_attn.v_proj": "v_proj", "self_attn.o_proj": "o_proj",
             "mlp.gate_proj": "gate_proj", "mlp.up_proj": "up_proj", "mlp.down_proj": "down_proj"}
    for theirs, mine in layer.items():
        out[f"layers.0.{theirs}.weight"] = sd[f"layer.{mine}.weight"]
    if drafter.draft_ids is not None:
        ids = sd["draft_ids"].long()
        out["lm_head.weight"] = sd["lm_head.weight"][ids]
        out["d2t"] = ids - torch.arange(len(ids))
        t2d = torch.zeros(drafter.vocab_size, dtype=torch.bool)
        t2d[ids] = True
        out["t2d"] = t2d
    return {k: (v.float() if v.is_floating_point() else v).contiguous() for k, v in out.items()}


def vllm_eagle3_config(drafter, target_config, verifier: str, num_speculative_tokens: int | None = None,
                       architectures=None) -> dict:
    """The speculators ``config.json`` of the exported head (keys: the module docstring; values from the head
    and the target's text config).

    Example:
        >>> # cfg = vllm_eagle3_config(head, lm.config, "HuggingFaceTB/SmolLM2-135M-Instruct", 3)
        >>> # cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    """
    _check_speculative_tokens(num_speculative_tokens)
    H, heads = drafter.hidden_size, drafter.num_heads
    k = int(drafter.num_draft_tokens if num_speculative_tokens is None else num_speculative_tokens)
    layer = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "vocab_size": drafter.vocab_size, "hidden_size": H, "intermediate_size": drafter.intermediate_size,
        "num_hidden_layers": 1, "num_attention_heads": heads, "num_key_value_heads": heads, "head_dim": H // heads,
        "hidden_act": "silu", "rms_norm_eps": drafter.rms_eps,
        "rope_theta": drafter.rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": drafter.rope_theta},
        "max_position_embeddings": int(getattr(target_config, "max_position_embeddings", 4096) or 4096),
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False, "dtype": "float32",
    }
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": layer,
        "draft_vocab_size": drafter.draft_vocab_size or drafter.vocab_size,
        "target_hidden_size": int(target_config.hidden_size),
        "norm_before_fc": True,
        "norm_before_residual": True,
        "fc_norm": False,
        "norm_output": False,
        "eagle_aux_hidden_state_layer_ids": list(drafter.layer_ids),
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": k}],
            "verifier": {"name_or_path": verifier,
                         "architectures": list(architectures or getattr(target_config, "architectures", None) or [])},
        },
        "mmspec": {"drafter_kind": drafter.kind, "layout": drafter.layout, "target_fingerprint": drafter.fingerprint},
    }


def load_target_for_export(path: str):
    """``(model, tokenizer or None)`` of a text target folder, float32 on the CPU (what the export reads the LM
    head rows and the fingerprint from).

    Example:
        >>> # model, tok = load_target_for_export(smollm2_path())
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .checks import check_local_folder

    check_local_folder(path, "target folder")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except (OSError, ValueError) as e:
        raise InvalidInputError(f"cannot load the target at {path} as a causal LM: {e}") from e
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):
        tokenizer = None
    return model.eval(), tokenizer


def export_head(head: str, fmt: str, out: str, target: str, verifier: str | None = None,
                num_speculative_tokens: int | None = None, target_model=None, tokenizer=None) -> str:
    """Write the saved head at ``head`` (a folder from ``mmspec train``) into ``out`` in format ``fmt``; returns
    ``out``. ``target``: the target's folder (its LM head rows go into the export, and the head's fingerprint is
    checked against it: a head of another target is refused); ``verifier``: the name the config gives the target
    (default: ``target``'s absolute path); ``target_model`` / ``tokenizer``: the target already loaded.

    Raises:
        InvalidInputError: an unknown format, a head kind or layout vLLM cannot load, layer ids vLLM cannot feed.
        DrafterMismatchError: the head was trained for another target.

    Example:
        >>> # export_head("runs/head", "vllm-eagle3", "runs/head-vllm", target=smollm2_path())
    """
    from safetensors.torch import save_file

    from .drafters.eagle import EagleDrafter
    from .drafters.saving import CONFIG_NAME, WEIGHTS_NAME

    if fmt not in FORMATS:
        raise InvalidInputError(f"unknown export format {fmt!r}; known: {', '.join(FORMATS)}")
    _check_speculative_tokens(num_speculative_tokens)
    if not os.path.isfile(os.path.join(head, CONFIG_NAME)):
        raise InvalidInputError(f"no saved drafter at {head} (expected {CONFIG_NAME})")
    if os.path.realpath(out) == os.path.realpath(head):  # the export's config/weights would replace the head's
        raise InvalidInputError(f"--out {out} is the head's own folder: export into another folder")
    with open(os.path.join(head, CONFIG_NAME)) as f:
        kind = json.load(f).get("drafter_kind")
    if kind != "eagle":
        raise InvalidInputError(f"{head} holds a {kind!r} head: vLLM's EAGLE-3 loader takes mmspec's EAGLE head only "
                                "(mmspec train --kind eagle --options '{\"layout\": \"eagle3\"}')")
    if target_model is None:
        target_model, tokenizer = load_target_for_export(target)
    drafter = EagleDrafter.from_pretrained(head, target=target_model, tokenizer=tokenizer)
    text = target_model.config.get_text_config(decoder=True)
    _check_exportable(drafter, text)
    tensors = vllm_eagle3_tensors(drafter)
    config = vllm_eagle3_config(drafter, text, verifier or os.path.abspath(target), num_speculative_tokens,
                                getattr(target_model.config, "architectures", None))
    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, WEIGHTS_NAME), metadata={"format": "pt"})
    with open(os.path.join(out, CONFIG_NAME), "w") as f:
        json.dump(config, f, indent=2)
    return out
