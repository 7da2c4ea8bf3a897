"""Autoregressive text-to-image generation, plain (no speculation): the baseline spatial speculation is
measured against.

Two backends behind one :class:`ImageARPipeline` (``pipe(prompt, seed, cfg_scale) -> PIL.Image``):

* **llama**: a ``LlamaForCausalLM`` whose vocabulary is the prompt tokenizer's followed by the VQ-VAE's
  codes (:mod:`mmspec.image_ar.vq`); a request is ``<bos> prompt <boi>`` and the model writes the code grid
  in raster order, logits restricted to the codes. Classifier-free guidance as Janus does it: the batch is
  doubled, the unconditional rows have every prompt token but ``<bos>`` / ``<boi>`` replaced by ``<pad>``
  (training drops prompts that way with probability ``p_uncond``), and ``logits = u + s * (c - u)``;
  then temperature and top-k, sampling from a seeded generator. The default scale is the model's own
  (``cfg_scale`` in ``image_generation.json``; 1.0, no guidance, when absent): in this world the prompt fixes
  the picture, the conditional model is already sharp, and guidance hurts (see :data:`DEFAULT_CFG_SCALE`).
* **janus**: transformers' ``JanusForConditionalGeneration`` in its native image mode (generation head,
  aligner, static cache, its own CFG processor), decoded by its VQ model.

With a drafter (``drafter="sjd"``, :mod:`mmspec.image_ar.sjd`) both backends decode through
:func:`mmspec.generate` instead (:func:`speculative_codes`; Janus through :class:`~mmspec.image_ar.janus.JanusImageLM`,
its image mode as a causal LM), with an acceptance ``rule`` (the lossless one of the mode by default; the relaxed
rules of :mod:`mmspec.image_ar.relaxed` are labelled lossy in :attr:`ImageARPipeline.last_stats`).

Requests are checked before any generation (:class:`mmspec.InvalidInputError`): prompts (a non-empty
string or a non-empty list of them), ``seed`` (an integer, or ``None`` for a fresh random one), ``temperature``
(finite, > 0), ``top_k`` (``None`` / 0 for none, else a positive integer) and ``cfg_scale`` (finite, >= 1).

Example:
    >>> from mmspec.image_ar import ImageARPipeline                                        # doctest: +SKIP
    >>> pipe = ImageARPipeline.from_pretrained("image_ar/assets/image-gen")                # doctest: +SKIP
    >>> pipe("a small red circle in the center on a white background", seed=0).size       # doctest: +SKIP
    (64, 64)
"""

from __future__ import annotations

import json
import math
import os
import time

import numpy as np
import torch

from mmspec.errors import InvalidInputError
from mmspec.pipelines import MMSpecPipeline

from .vq import VQVAE, pixels_to_tensor, to_image

__all__ = ["ImageARPipeline", "build_generator", "train_generator", "generate_codes", "speculative_codes",
           "SPECIAL_TOKENS",
           "DEFAULT_CFG_SCALE", "JANUS_CFG_SCALE", "bundled_generator", "export_generator"]

SPECIAL_TOKENS = ("<pad>", "<bos>", "<boi>", "<eoi>", "<unk>")
GEN_CONFIG = "image_generation.json"
JANUS_CFG_SCALE = 5.0
"""Guidance for a Janus model whose generation config names none (what transformers' Janus falls back to)."""
DEFAULT_CFG_SCALE = 1.0
"""Guidance for a llama generator whose ``image_generation.json`` names none. Token-level guidance
``u + s (c - u)`` hurts a generator whose prompt determines the picture: the unconditional rows still read
the codes drawn so far and are often *surer* of the next code than the conditional rows (teacher-forced,
94.8% top-1 against 99.2%), and wherever ``u`` is surer of the token ``c`` prefers, ``s > 1`` pushes another
token up. Measured on the bundled generator (n = 200, temperature 1; ``assets/image-gen/eval.jsonl``):
prompt accuracy 86% at 1.0, 82.5% at 1.5, 48% at 2.0, 1% at 3.0."""


def _tokenizer(texts, vocab_size: int):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers, decoders
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                                        show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", unk_token="<unk>",
                                   extra_special_tokens={"boi_token": "<boi>", "eoi_token": "<eoi>"})


def build_generator(vq: VQVAE, size: str = "small", tokenizer_texts: int = 2000, vocab_size: int = 256,
                    grid: int = 16, seed: int = 0):
    """A fresh ``(LlamaForCausalLM, tokenizer)``: text vocabulary, then ``vq.codebook_size`` code ids."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from mmspec.workloads import get_workload

    wl = get_workload("images")
    tok = _tokenizer([wl.text_example("train", i).prompt for i in range(tokenizer_texts)], vocab_size)
    dims = {"tiny": (64, 128, 2, 4), "medium": (192, 512, 4, 6), "small": (256, 704, 6, 8)}[size]
    config = LlamaConfig(vocab_size=len(tok) + vq.codebook_size, hidden_size=dims[0], intermediate_size=dims[1],
                         num_hidden_layers=dims[2], num_attention_heads=dims[3], num_key_value_heads=dims[3] // 2,
                         max_position_embeddings=64 + grid * grid, bos_token_id=tok.bos_token_id,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.convert_tokens_to_ids("<eoi>"),
                         tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.image_code_offset = len(tok)
    return model, tok


def _request_ids(tok, prompts) -> tuple[torch.Tensor, torch.Tensor]:
    """``<bos> prompt <boi>`` rows, left-padded: ``(input_ids, attention_mask)``."""
    boi = tok.convert_tokens_to_ids("<boi>")
    rows = [[tok.bos_token_id] + tok(p, add_special_tokens=False)["input_ids"] + [boi] for p in prompts]
    L = max(len(r) for r in rows)
    ids = torch.full((len(rows), L), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(rows), L, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, L - len(r):], mask[i, L - len(r):] = torch.tensor(r), 1
    return ids, mask


def _with_codes(ids: torch.Tensor, mask: torch.Tensor, codes: torch.Tensor) -> tuple:
    """Requests (left-padded ``ids``/``mask``) followed by code-token rows: ``(input_ids, attention_mask,
    position_ids)`` for a teacher-forced pass (positions count real tokens, as in generation)."""
    full_mask = torch.cat([mask, torch.ones_like(codes)], dim=1)
    return torch.cat([ids, codes], dim=1), full_mask, (full_mask.cumsum(-1) - 1).clamp(min=0)


def _unconditional(ids: torch.Tensor, tok) -> torch.Tensor:
    """Janus's unconditional rows: every token but ``<bos>``/``<boi>`` (and padding) becomes ``<pad>``."""
    keep = (ids == tok.bos_token_id) | (ids == tok.convert_tokens_to_ids("<boi>"))
    return ids.masked_fill(~keep, tok.pad_token_id)


@torch.no_grad()
def generate_codes(model, input_ids, attention_mask, tok, n_codes: int, cfg_scale: float = DEFAULT_CFG_SCALE,
                   temperature: float = 1.0, top_k: int | None = None, generator=None,
                   do_sample: bool = True) -> torch.Tensor:
    """Sample ``n_codes`` image codes per row (raster order) with classifier-free guidance; ``[B, n_codes]``
    code indices (``0..codebook_size-1``). ``cfg_scale <= 1`` runs the conditional rows only;
    ``do_sample=False`` takes the guided argmax at every step (greedy)."""
    from transformers import DynamicCache

    offset = int(model.generation_config.image_code_offset)
    B = input_ids.shape[0]
    guided = cfg_scale is not None and cfg_scale > 1.0
    ids = torch.cat([input_ids, _unconditional(input_ids, tok)]) if guided else input_ids
    mask = torch.cat([attention_mask, attention_mask]) if guided else attention_mask
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
    codes = torch.zeros(B, n_codes, dtype=torch.long, device=input_ids.device)
    for i in range(n_codes):
        logits = out.logits[:, -1, offset:].float()
        if guided:
            cond, unc = logits[:B], logits[B:]
            logits = unc + cfg_scale * (cond - unc)
        logits = logits / max(temperature, 1e-5)
        if top_k:
            kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if do_sample:
            probs = torch.softmax(logits, dim=-1)
            dev = generator.device if generator is not None else probs.device
            nxt = torch.multinomial(probs.to(dev), 1, generator=generator).squeeze(-1).to(input_ids.device)
        else:
            nxt = logits.argmax(dim=-1)
        codes[:, i] = nxt
        step = (nxt + offset)[:, None]
        step = torch.cat([step, step]) if guided else step
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        pos = pos[:, -1:] + 1
        out = model(input_ids=step, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
    return codes


@torch.no_grad()
def speculative_codes(model, input_ids, attention_mask, tok, n_codes: int, drafter, rule=None,
                      cfg_scale: float = DEFAULT_CFG_SCALE, temperature: float = 1.0, top_k: int | None = None,
                      generator=None, do_sample: bool = True, codebook=None):
    """:func:`generate_codes` through :func:`mmspec.generate` with ``drafter`` (``"sjd"``, a spec or a
    :class:`~mmspec.drafters.Drafter`) and acceptance ``rule`` (``None``: the lossless rule of the mode; a name
    such as ``"lantern++;lambda=2"``): ``(codes [B, n_codes], SpecStats)``. A spec is resolved to a drafter first, so
    a drafter whose mode needs its own rule (``"spatial;rounds=1"``: ``ssd_correct``, lossy) gets it when ``rule`` is
    ``None``; ``"ssd_correct"`` named alone follows the run's mode (greedy or sampling).

    The target's processed distribution is the one :func:`generate_codes` samples from: guidance
    ``u + s (c - u)`` in a doubled batch (:class:`mmspec.target.Guidance`), then every non-code token suppressed,
    then temperature and top-k; drafts and the residual see the same. Rules that read the VQ codebook (LANTERN++,
    GSD's latent test) are given ``codebook`` (``[K, d]``, code ``i`` is token ``offset + i``).

    Example:
        >>> codes, stats = speculative_codes(model, ids, mask, tok, 256, "sjd", seed=0)   # doctest: +SKIP
    """
    from mmspec import generate
    from mmspec.acceptance import get_rule
    from mmspec.drafters.base import Drafter
    from mmspec.target import Guidance

    from .ssd import SpatialCorrectRule

    offset = int(model.generation_config.image_code_offset)
    guided = cfg_scale is not None and cfg_scale > 1.0
    guidance = Guidance(float(cfg_scale), _unconditional(input_ids, tok)) if guided else None
    if drafter is not None and not isinstance(drafter, Drafter):
        from mmspec.registry import make_drafter

        drafter = make_drafter(drafter, model)  # a spec: resolved first, so its mode can choose the rule below
    if rule is None and getattr(drafter, "make_rule", None) is not None:
        rule = drafter.make_rule(do_sample)  # a drafter whose mode needs its own rule (spatial's rounds=r, lossy)
    if isinstance(rule, str) and rule.strip() == "ssd_correct":
        rule = SpatialCorrectRule(greedy=not do_sample)  # the name alone follows the run's mode
    try:
        rule = get_rule(rule, do_sample)
    except ValueError as e:  # an unknown rule or bad options
        raise InvalidInputError(str(e)) from e
    if isinstance(rule, SpatialCorrectRule) and rule.greedy == do_sample:
        raise InvalidInputError(f"acceptance rule ssd_correct was built for {rule.mode} runs; this run "
                                f"{'samples' if do_sample else 'is greedy'}")
    if not do_sample and rule.mode == "sample" and not rule.lossless:
        raise InvalidInputError(f"acceptance rule {rule.name!r} is a relaxed sampling rule; use do_sample=True")
    if hasattr(rule, "bind_codebook"):
        if codebook is None:
            raise InvalidInputError(f"acceptance rule {rule.name!r} reads the VQ codebook; this generator has none")
        rule.bind_codebook(codebook, offset)
    sampling = dict(temperature=float(temperature), top_k=top_k or None) if do_sample else {}
    out = generate(model, {"input_ids": input_ids, "attention_mask": attention_mask}, drafter=drafter, rule=rule,
                   guidance=guidance, generator=generator, do_sample=do_sample, max_new_tokens=n_codes,
                   suppress_tokens=list(range(offset)), **sampling)
    return out.sequences[:, input_ids.shape[1]:] - offset, out.stats


class ImageARPipeline(MMSpecPipeline):
    """``pipe(prompt, seed=0, cfg_scale=None, temperature=1.0, top_k=None) -> PIL.Image`` for both backends
    (see the module docstring); :meth:`from_pretrained` picks the backend from ``config.json``.

    ``MMSpecPipeline.from_pretrained(folder)`` returns one for a folder whose config says ``"mmspec_task":
    "images"`` (what :meth:`save_pretrained` writes).

    Example:
        >>> pipe = ImageARPipeline.from_pretrained("image_ar/assets/image-gen")                # doctest: +SKIP
        >>> pipe(["a red circle in the center on a white background"] * 2, seed=None)          # doctest: +SKIP
    """

    task = "images"
    model_types = ()  # a llama code generator is recognised by its config's mmspec_task, not its model type

    def __init__(self, model, tokenizer, vq: VQVAE | None = None, grid: int | None = None,
                 cfg_scale: float | None = None, drafter=None, rule=None):
        backend = "janus" if model.config.model_type == "janus" else "llama"
        if backend == "llama" and grid:  # what a Jacobi drafter's vertical-repeat initialisation reads
            model.generation_config.image_grid = int(grid)
        # Janus's image mode as a causal LM over [text | codes], for speculation (its plain path is its own loop)
        self._image_lm = None
        if backend == "janus":
            from .janus import JanusImageLM

            self._image_lm = JanusImageLM(model)
            side = math.isqrt(int(model.model.vision_model.config.num_image_tokens))
            self._image_lm.generation_config.image_grid = side
        if rule is not None and not hasattr(rule, "accept"):
            from mmspec.acceptance import get_rule

            try:
                get_rule(rule, do_sample=True)  # an unknown name or bad options: said before any work
            except ValueError as e:
                raise InvalidInputError(str(e)) from e
        super().__init__(model, tokenizer, drafter=drafter if backend == "llama" else None)
        if backend == "janus" and drafter is not None:
            from mmspec.registry import make_drafter

            self.drafter = make_drafter(drafter, self._image_lm)
        self.model, self.tokenizer, self.vq = model, tokenizer, vq
        self.backend = backend
        self.rule = rule
        self.last_stats = None
        self.last_codes = None
        self.grid = grid
        if cfg_scale is None and self.backend == "janus":  # its config's, else transformers' Janus default
            cfg_scale = getattr(model.generation_config, "guidance_scale", None) or JANUS_CFG_SCALE
        if cfg_scale is None:
            cfg_scale = DEFAULT_CFG_SCALE
        self.cfg_scale = float(cfg_scale)  # what a call without ``cfg_scale`` uses
        self.last_timings_ms: dict = {}

    @classmethod
    def _from_config(cls, target, config, drafter=None, dtype=None, device_map=None, trust_remote_code=False,
                     **kw):
        return cls.from_pretrained(target, dtype="auto" if dtype is None else dtype, drafter=drafter,
                                   device_map=device_map, **kw)

    @classmethod
    def from_pretrained(cls, path: str, dtype="auto", drafter=None, device_map=None, **kw) -> "ImageARPipeline":
        """Load a generator saved by :meth:`save_pretrained`; ``dtype="auto"`` runs it in the dtype its weights
        are stored in (bf16 for the bundled one; the VQ decoder stays float32), or a dtype name.

        ``drafter``: a drafter spec (``"sjd"``, ``"sjd;draft_len=8;init=random"``) for speculative
        decoding through :func:`mmspec.generate`; ``rule=`` an acceptance rule name (default: the lossless rule of
        the mode; ``"lantern++;lambda=2"``, ``"csd"``, ``"gsd"`` are relaxed and labelled lossy in
        :attr:`last_stats`).

        Example:
            >>> ImageARPipeline.from_pretrained(GENERATOR_DIR).model.dtype          # doctest: +SKIP
            torch.bfloat16
            >>> pipe = ImageARPipeline.from_pretrained(GENERATOR_DIR, drafter="sjd")           # doctest: +SKIP
            >>> img = pipe("a small red circle in the center on a white background", seed=0)  # doctest: +SKIP
            >>> pipe.last_stats.lossless, pipe.last_stats.target_forwards < 256                # doctest: +SKIP
            (True, True)
        """
        from mmspec.checkpoints import resolve_dtype
        from mmspec.checks import check_device_map, check_local_folder

        path = check_local_folder(path, "image generator folder")  # said at once, not tried as a hub id
        kw.pop("trust_remote_code", None)  # both backends are transformers' own classes
        rule = kw.pop("rule", None)
        if kw:
            raise InvalidInputError(f"the image pipeline takes no further loading arguments (got {sorted(kw)})")
        check_device_map(device_map)
        if device_map is not None and (not isinstance(device_map, (str, torch.device)) or str(device_map) == "auto"):
            raise InvalidInputError(f"the image generator runs on one device: pass device_map='cpu', 'cuda'... "
                                    f"(got {device_map!r})")
        model_type = None
        if os.path.isfile(os.path.join(path, "config.json")):
            with open(os.path.join(path, "config.json")) as f:
                model_type = json.load(f).get("model_type")
        if model_type != "janus" and not os.path.isfile(os.path.join(path, GEN_CONFIG)):
            raise InvalidInputError(f"{path} is not an image generator folder (neither a Janus model nor a llama "
                                    f"code generator with {GEN_CONFIG} and its vq/)")
        dtype = resolve_dtype(dtype, path)
        pipe = cls._load(path, dtype, drafter, rule)
        if device_map is not None:
            pipe.model.to(torch.device(device_map))
            if pipe.vq is not None:
                pipe.vq.to(torch.device(device_map))
        return pipe

    @classmethod
    def _load(cls, path: str, dtype, drafter=None, rule=None) -> "ImageARPipeline":
        from transformers import AutoConfig, AutoTokenizer, JanusForConditionalGeneration, LlamaForCausalLM

        config = AutoConfig.from_pretrained(path)
        tok = AutoTokenizer.from_pretrained(path)
        if config.model_type == "janus":
            model = JanusForConditionalGeneration.from_pretrained(path, dtype=dtype).eval()
            gc = model.generation_config
            if not getattr(gc, "generation_kwargs", None):  # its image loop reads <boi> from here
                gc.generation_kwargs = {"boi_token_id": tok.convert_tokens_to_ids("<boi>")}
            return cls(model, tok, drafter=drafter, rule=rule)
        with open(os.path.join(path, GEN_CONFIG)) as f:
            extra = json.load(f)
        model = LlamaForCausalLM.from_pretrained(path, dtype=dtype).eval()
        model.generation_config.image_code_offset = extra["image_code_offset"]
        return cls(model, tok, VQVAE.from_pretrained(os.path.join(path, "vq")), grid=extra["grid"],
                   cfg_scale=extra.get("cfg_scale"), drafter=drafter, rule=rule)

    def save_pretrained(self, path: str, dtype=None) -> None:
        """Model, tokenizer (and for the llama backend the VQ-VAE and the grid); ``dtype`` stores the weights
        compactly (loading upcasts to float32)."""
        from mmspec.checkpoints import save_hf_compact

        from mmspec.pipelines import TASK_KEY

        os.makedirs(path, exist_ok=True)
        # The folder says what it is, so MMSpecPipeline.from_pretrained returns an ImageARPipeline for it (the
        # generator alone is a plain llama, which would load as a text model).
        setattr(self.model.config, TASK_KEY, "images")
        if self.backend == "janus":  # its scale travels in its generation config
            self.model.generation_config.guidance_scale = self.cfg_scale
        if dtype is None:
            self.model.save_pretrained(path)
        else:
            save_hf_compact(self.model, path, dtype)
        self.tokenizer.save_pretrained(path)
        if self.backend == "llama":
            self.vq.save_pretrained(os.path.join(path, "vq"), dtype)
            with open(os.path.join(path, GEN_CONFIG), "w") as f:
                json.dump({"image_code_offset": int(self.model.generation_config.image_code_offset),
                           "grid": self.grid, "cfg_scale": self.cfg_scale}, f)

    def prepare(self, images=None, prompt=None) -> dict:
        """The model inputs of a request, as ``mmspec train``'s data stage asks every pipeline for them:
        ``{"input_ids", "attention_mask"}`` of ``<bos> prompt <boi>`` (a text-to-image request shows no image).

        Example:
            >>> pipe.prepare(prompt="a blue square")["input_ids"].shape                 # doctest: +SKIP
            torch.Size([1, 6])
        """
        if images:
            raise InvalidInputError("a text-to-image request takes no input images")
        ids, mask = _request_ids(self.tokenizer, _check_prompts(prompt))
        return {"input_ids": ids.to(self.model.device), "attention_mask": mask.to(self.model.device)}

    @torch.no_grad()
    def __call__(self, prompt, seed: int = 0, cfg_scale: float | None = None, temperature: float = 1.0,
                 top_k: int | None = None, do_sample: bool = True):
        """One image per prompt (a list gives a list, generated as one batch); ``cfg_scale=None`` uses the
        model's own :attr:`cfg_scale`; ``seed=None`` draws a fresh random seed (a different picture each call);
        ``do_sample=False`` decodes greedily (the guided argmax; llama backend). With a :attr:`drafter` the codes
        come from :func:`speculative_codes` and :attr:`last_stats` holds the run's ``SpecStats`` (``lossless``
        says whether the rule keeps the target's law).

        Raises:
            InvalidInputError: an empty or non-string prompt, an empty list, a seed that is not an integer,
                ``temperature`` not finite and > 0, ``top_k`` negative or not an integer, ``cfg_scale`` not
                finite and >= 1 (1: no guidance; below 1 would silently mean 1).

        Example:
            >>> pipe("a small red circle in the center on a white background", seed=0)   # doctest: +SKIP
        """
        prompts = _check_prompts(prompt)
        cfg_scale = self.cfg_scale if cfg_scale is None else cfg_scale
        if isinstance(cfg_scale, bool) or not isinstance(cfg_scale, (int, float)) or not math.isfinite(cfg_scale) \
                or cfg_scale < 1.0:
            raise InvalidInputError(f"cfg_scale must be a finite number >= 1 (1: no guidance; got {cfg_scale!r})")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
                or not math.isfinite(temperature) or temperature <= 0:
            raise InvalidInputError(f"temperature must be a finite number > 0 (got {temperature!r})")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 0):
            raise InvalidInputError(f"top_k must be None, 0 (no top-k filtering) or a positive integer (got {top_k!r})")
        top_k = (int(top_k) or None) if top_k is not None else None
        if not isinstance(do_sample, bool):
            raise InvalidInputError(f"do_sample must be True or False (got {do_sample!r})")
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little") >> 1  # fresh, and independent of the global RNG
        elif isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise InvalidInputError(f"seed must be an integer, or None for a fresh random one (got {seed!r})")
        seed = int(seed)
        gen = torch.Generator(device=self.model.device).manual_seed(seed)
        ids, mask = _request_ids(self.tokenizer, prompts)
        ids, mask = ids.to(self.model.device), mask.to(self.model.device)
        t0 = time.perf_counter()
        self.last_stats = None
        if self.backend == "janus":
            torch.manual_seed(seed)  # Janus's loop samples with the global generator
            if not cfg_scale > 1.0:
                # Its image loop always runs the doubled (conditional + unconditional) batch and halves it in
                # the guidance step, which it adds whatever it is asked.
                raise InvalidInputError(f"transformers' Janus image mode always guides: cfg_scale must be > 1 "
                                        f"(got {cfg_scale})")
            if self.drafter is not None:  # the same loop as the llama generator's, through JanusImageLM
                codes, self.last_stats = speculative_codes(
                    self._image_lm, ids, mask, self.tokenizer, self._image_lm.generation_config.image_grid ** 2,
                    self.drafter, self.rule, cfg_scale, temperature, top_k, gen, do_sample,
                    codebook=self.model.model.vqmodel.quantize.embedding.weight.detach())
                codes = codes.to(ids.dtype)
            else:
                codes = self.model.generate(ids, attention_mask=mask, generation_mode="image", do_sample=do_sample,
                                            guidance_scale=cfg_scale, temperature=temperature, top_k=top_k)
            t1 = time.perf_counter()
            pixels = self.model.decode_image_tokens(codes).permute(0, 3, 1, 2)
        elif self.drafter is not None:
            codes, self.last_stats = speculative_codes(
                self.model, ids, mask, self.tokenizer, self.grid * self.grid, self.drafter, self.rule, cfg_scale,
                temperature, top_k, gen, do_sample, codebook=self.vq.codebook)
            t1 = time.perf_counter()
            pixels = self.vq.decode(codes.view(-1, self.grid, self.grid))
        else:
            codes = generate_codes(self.model, ids, mask, self.tokenizer, self.grid * self.grid, cfg_scale,
                                   temperature, top_k, gen, do_sample)
            t1 = time.perf_counter()
            pixels = self.vq.decode(codes.view(-1, self.grid, self.grid))
        self.last_codes = codes
        self.last_timings_ms = {"generate": (t1 - t0) * 1e3, "decode": (time.perf_counter() - t1) * 1e3,
                                "tokens": int(codes.shape[1]),
                                # target passes: one per code for plain AR (the prefill draws the first)
                                "target_forwards": (self.last_stats.target_forwards if self.last_stats is not None
                                                    else int(codes.shape[1]))}
        images = [to_image(p) for p in pixels]
        return images[0] if isinstance(prompt, str) else images


def _check_prompts(prompt) -> list[str]:
    """The prompts of a request as a list; raises :class:`~mmspec.InvalidInputError` on a malformed one."""
    if prompt is None:
        raise InvalidInputError("a prompt is required (a string, or a list of strings for a batch)")
    if isinstance(prompt, str):
        prompts = [prompt]
    elif isinstance(prompt, (list, tuple)):
        prompts = list(prompt)
        if not prompts:
            raise InvalidInputError("the prompt list is empty")
    else:
        raise InvalidInputError(f"prompt must be a string or a list of strings (got {type(prompt).__name__})")
    for i, p in enumerate(prompts):
        which = f"prompt {i}" if not isinstance(prompt, str) else "the prompt"
        if not isinstance(p, str):
            raise InvalidInputError(f"{which} must be a string (got {type(p).__name__})")
        if not p.strip():
            raise InvalidInputError(f"{which} is empty; describe the picture (e.g. 'a small red circle in the center "
                                    "on a white background')")
    return prompts


GENERATOR_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets", "image-gen")


def bundled_generator() -> str | None:
    """The bundled trained image generator's folder (with its VQ-VAE; ``None`` if this install has none).

    Example:
        >>> bundled_generator() is None or os.path.isdir(os.path.join(bundled_generator(), "vq"))
        True
    """
    return GENERATOR_DIR if os.path.isfile(os.path.join(GENERATOR_DIR, GEN_CONFIG)) else None


def export_generator(src: str, out: str = GENERATOR_DIR, dtype=torch.bfloat16) -> str:
    """The shippable copy of a trained generator (and its VQ-VAE): weights in ``dtype``, loaded as float32."""
    from mmspec.checkpoints import copy_training_files

    ImageARPipeline.from_pretrained(src, dtype=torch.float32).save_pretrained(out, dtype=dtype)
    copy_training_files(src, out)
    return out


class _CodeBatches(torch.utils.data.Dataset):
    """Step ``i`` of generator training: the ``images`` workload's train items ``i * batch_size ...``, as
    ``(prompts, pixels)`` (uint8 ``[B, H, W, 3]``: a quarter of float32's bytes through the workers' shared memory);
    a dataset so DataLoader workers can draw pictures while the device trains (the batch of a step is the same with
    or without workers)."""

    def __init__(self, batch_size: int, image_size: int):
        from mmspec.workloads import get_workload

        self.batch_size, self.wl = batch_size, get_workload("images", size=image_size)

    def __len__(self) -> int:
        return 2 ** 31 - 1

    def __getitem__(self, step: int):
        exs = self.wl.examples("train", self.batch_size, start=step * self.batch_size)
        return [ex.prompt for ex in exs], torch.from_numpy(np.stack([np.asarray(ex.meta["image"].convert("RGB"))
                                                                     for ex in exs]))


def train_generator(out: str, vq_path: str, steps: int = 3000, batch_size: int = 16, lr: float = 1e-3,
                    size: str = "small", p_uncond: float = 0.1, save_every: int = 250, seed: int = 0,
                    progress: bool = True, image_size: int = 64, device: str | None = None,
                    workers: int = 0) -> ImageARPipeline:
    """Train (or resume) the llama backend on the ``images`` workload, codes from the frozen VQ-VAE at
    ``vq_path``; cross-entropy on the code tokens and ``<eoi>``; prompts dropped to ``<pad>`` with
    probability ``p_uncond`` (what guidance needs). Writes ``save_pretrained`` checkpoints and a log.

    ``image_size`` sets the grid (the VQ-VAE is convolutional: 64 px -> 16 x 16 codes, 128 px -> 32 x 32);
    ``device`` (e.g. ``"cuda"``; bf16 autocast there) and ``workers`` (processes drawing the pictures) only
    change speed. A resumed run keeps the grid it started with.

    Example:
        >>> train_generator("runs/gen32", "image_ar/assets/image-gen/vq", image_size=128,
        ...                 device="cuda", workers=8)                                   # doctest: +SKIP
    """
    from tqdm import tqdm

    from mmspec.drafters.eagle import warmup_cosine
    from mmspec.train import trim_log

    os.makedirs(out, exist_ok=True)
    state_path = os.path.join(out, "state.pt")
    device = torch.device(device or "cpu")
    vq = VQVAE.from_pretrained(vq_path).to(device)
    grid = int(vq.encode(torch.zeros(1, 3, image_size, image_size, device=device)).shape[-1])
    if os.path.isfile(state_path):
        pipe = ImageARPipeline.from_pretrained(out, dtype=torch.float32)
        saved = torch.load(state_path, weights_only=True, map_location="cpu")  # a GPU run resumes anywhere
        if pipe.grid != grid:
            raise InvalidInputError(f"{out} was trained on a {pipe.grid} x {pipe.grid} grid; image_size="
                                    f"{image_size} gives {grid} x {grid}")
        pipe.vq = vq
    else:
        model, tok = build_generator(vq, size, grid=grid, seed=seed)
        pipe, saved = ImageARPipeline(model, tok, vq, grid=grid), None
    model, tok = pipe.model.to(device), pipe.tokenizer
    offset = int(model.generation_config.image_code_offset)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(100, steps))
    start = 0
    if saved is not None:
        opt.load_state_dict(saved["optimizer"])
        sched.load_state_dict(saved["scheduler"])
        start = int(saved["step"])
    log = os.path.join(out, "train_log.jsonl")
    trim_log(log, start)
    batches = torch.utils.data.DataLoader(_CodeBatches(batch_size, image_size), batch_size=None,
                                          sampler=range(start, steps), num_workers=workers,
                                          prefetch_factor=4 if workers else None, persistent_workers=False)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")
    eoi = tok.convert_tokens_to_ids("<eoi>")
    model.train()
    bar = tqdm(total=steps, initial=start, disable=not progress, desc=f"image generator {grid}x{grid}")
    t0, logged = time.perf_counter(), start
    for step, (prompts, pixels) in enumerate(batches, start):  # the sampler yields steps start..steps-1
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        with torch.no_grad():
            codes = vq.encode(pixels_to_tensor(pixels.to(device))).flatten(1) + offset  # stays on the device
        ids, mask = _request_ids(tok, prompts)
        drop = torch.rand(batch_size, generator=g) < p_uncond
        ids[drop] = _unconditional(ids[drop], tok)
        seq, full_mask, pos = _with_codes(ids.to(device), mask.to(device),
                                          torch.cat([codes, torch.full((batch_size, 1), eoi, device=device)], dim=1))
        labels = seq.clone()
        labels[:, : ids.shape[1]] = -100
        with autocast:
            loss = model(input_ids=seq, attention_mask=full_mask, position_ids=pos, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        bar.update(1)
        if (step + 1) % 10 == 0 or step + 1 == steps or device.type == "cpu":  # .item() syncs a GPU: not every step
            with open(log, "a") as f:
                f.write(json.dumps({"step": step + 1, "loss": round(loss.item(), 4), "lr": sched.get_last_lr()[0],
                                    "sec": round((time.perf_counter() - t0) / (step + 1 - logged), 3)}) + "\n")
            t0, logged = time.perf_counter(), step + 1
        if (step + 1) % save_every == 0 or step + 1 == steps:
            model.eval()
            pipe.save_pretrained(out)
            model.train()
            tmp = state_path + ".tmp"
            torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "step": step + 1}, tmp)
            os.replace(tmp, state_path)
    bar.close()
    model.eval()
    return pipe
