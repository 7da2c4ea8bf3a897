"""GLANCE: a DFlash-style block head over the target's fused states at every prompt position, the page's
included, with the target's own M-RoPE positions on its context keys; a best-first tree per round.

The head, its cache and its tree are the core's block body (:class:`~mmspec.drafters.block.BlockDrafter`);
this kind adds what is GLANCE's: the ``image_features`` option (``own``, or ``shuffled``: another item's
image-position states swapped in, the proof that the head reads the page; see
:class:`~mmspec.vision.glance.head.ShuffledImageFeatures`), the ``context`` option (``all``, or ``text``: the head
attends to text positions only, prompt and response, never to image tokens; a trained property, saved with the
head: the two-reasoner driving VLA's routine reasoner reads the ego history, not the frames) and its registry
spelling.

The pointer (``pointer=True`` at training, saved with the head): a copy path on top of the block head
(:class:`~mmspec.drafters.block.BlockHead`). GLANCE's image positions enter it as tokens: each is read as the
vocabulary token whose input embedding is nearest to the vector the target's language model receives there
(:func:`~mmspec.vision.glance.head.context_tokens`, from the target's ``hidden_states[0]``, so the head requests
layer 0 too); the head then matches its committed tokens against the page read that way and reads on from the
match. With ``image_features=shuffled`` those vectors are another item's too.

Differences from GLANCE's code (``js-lee-AI/GLANCE``, see the research notes): its head keeps 1-D positions
(here the context keys take the target's M-RoPE positions, so an image token's key knows its row and
column; ``rope=flat`` gives GLANCE's 1-D sequence indices); its mask token is a vocabulary id (here a learnt
vector); under sampling it samples from the target and matches (here the core's lossless rejection rule: a
sampled chain with its ``q``, or a deterministic tree); block length and tree size come from options and the
core's :class:`~mmspec.budget.DepthBudget` (``depth_budget=auto``) rather than fixed at 16 / 63.

Example:
    >>> from mmspec.registry import make_drafter                                      # doctest: +SKIP
    >>> d = make_drafter("glance:HEAD;branch_k=4;tree_budget=24", target)            # doctest: +SKIP
    >>> d = make_drafter("glance:HEAD;image_features=shuffled", target)              # doctest: +SKIP
"""

from __future__ import annotations

from mmspec.drafters.block import BlockDrafter
from mmspec.drafters.base import DraftContext
from mmspec.errors import InvalidInputError

from .head import ShuffledImageFeatures, context_tokens, image_token_mask, token_pairs

__all__ = ["GlanceDrafter", "CONTEXTS", "IMAGE_FEATURES", "RUN_OPTIONS", "glance_factory"]

IMAGE_FEATURES = ("own", "shuffled")
"""Values of the ``image_features`` option."""

CONTEXTS = ("all", "text")
"""Values of the ``context`` option: what the head attends to (every committed position, or text positions only)."""

RUN_OPTIONS = ("num_draft_tokens", "branch_k", "tree_budget", "depth_budget", "image_features")
"""Options that change how a saved head drafts, not what it learnt (accepted with ``glance:PATH``)."""


class GlanceDrafter(BlockDrafter):
    """The GLANCE block drafter. Arguments as :class:`~mmspec.drafters.block.BlockDrafter`, plus
    ``image_features``: ``"own"`` (default) or ``"shuffled"`` (the reading ablation), and ``context``: ``"all"``
    (default) or ``"text"`` (image positions never enter the head's context).

    Example:
        >>> import torch
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> t = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
        ...                      num_hidden_layers=2, num_attention_heads=2))
        >>> d = GlanceDrafter.from_target(t, block_size=4, branch_k=2)
        >>> d.kind, d.config_dict()["image_features"], d.num_draft_tokens
        ('glance', 'own', 3)
    """

    kind = "glance"

    def __init__(self, *args, image_features: str = "own", context: str = "all", **kw):
        super().__init__(*args, **kw)
        if context not in CONTEXTS:
            raise ValueError(f"context must be one of {CONTEXTS} (got {context!r})")
        if context != "all" and self.head.pointer:
            # the run-time cache holds only visible positions, so "m slots after the match" would skip the hidden
            # ones there but not in training: the two would read different values
            raise ValueError("a pointer head reads every context position: context must be 'all'")
        self.context = context
        self.image_features = image_features
        self._check_image_option()
        self.shuffler = ShuffledImageFeatures()
        self.embed_shuffler = ShuffledImageFeatures()  # the LM's input vectors at image positions (a pointer head)
        self._pairs = None  # the target's token pairs (token_pairs), found at the first request

    @property
    def hidden_layers(self) -> tuple:
        # a pointer head reads image positions as tokens from the vectors the target's LM receives there
        layers = super().hidden_layers
        return tuple(dict.fromkeys((0,) + layers)) if self.head.pointer else layers

    def _check_image_option(self) -> None:
        if self.image_features not in IMAGE_FEATURES:
            raise ValueError(f"image_features must be one of {IMAGE_FEATURES} (got {self.image_features!r})")

    def config_dict(self) -> dict:
        return {**super().config_dict(), "image_features": self.image_features, "context": self.context}

    def prompt_visible(self, ctx: DraftContext, rows: list, lengths: list) -> list | None:
        if self.context == "all":
            return None
        model = self._target_ref[0]
        return [~image_token_mask(model, ctx.model_inputs, r) for r in rows]

    def prompt_tokens(self, ctx: DraftContext, rows: list, prompts: list) -> list:
        """Image positions read as the tokens nearest to the target's input vectors there
        (:func:`~mmspec.vision.glance.head.context_tokens`); with ``image_features="shuffled"`` those vectors are
        another item's, as its image states are (the ablation takes the whole image away, what it reads as too)."""
        model = self._target_ref[0]
        if 0 not in ctx.hidden:
            raise InvalidInputError("a GLANCE pointer head needs the target's hidden_states[0]; run it through "
                                    "mmspec.generate (which requests its hidden_layers)")
        L = ctx.hidden[0].shape[1]
        embeds = [ctx.hidden[0][b, L - len(p):] for b, p in enumerate(prompts)]
        if self.image_features == "shuffled":
            masks = [image_token_mask(model, ctx.model_inputs, r).to(e.device) for r, e in zip(rows, embeds)]
            embeds = self.embed_shuffler.swap(embeds, masks)
        if self._pairs is None:
            self._pairs = token_pairs(model)
        return [context_tokens(model, p, e, self._pairs) for p, e in zip(prompts, embeds)]

    def prompt_features(self, ctx: DraftContext, rows: list, features: list, positions: list) -> list:
        if self.image_features == "own":
            return features
        model = self._target_ref[0]
        masks = [image_token_mask(model, ctx.model_inputs, r).to(f.device) for r, f in zip(rows, features)]
        return self.shuffler.swap(features, masks)


def glance_factory(target_model, path=None, tokenizer=None, cls=None, **options):
    """``"glance:PATH"`` loads a saved head (checked against the target's fingerprint, cast to the target's
    dtype); ``"glance"`` with at most run options loads the head that ships for the target
    (:func:`mmspec.workloads.bundled_drafter_path`, e.g. the reader's) where one does, else builds an untrained one,
    as any construction option (``seed``, ``block_size``, ...) does (tests, ablations of exactness). Run options
    (:data:`RUN_OPTIONS`) override the saved ones and are checked before any weights load. ``cls``: a
    subclass to build instead (TIGER's factory passes its own)."""
    cls = cls or GlanceDrafter
    kind = cls.kind
    run = {k: options.pop(k) for k in RUN_OPTIONS if k in options}
    if not path and not options and target_model is not None:
        # the bare kind means the trained head where one ships (as ``mmspec bench --systems glance`` reads it), never
        # a random one next to it
        from mmspec.workloads import bundled_drafter_path

        path = bundled_drafter_path(kind, target_model)
    for k in ("num_draft_tokens", "branch_k", "tree_budget"):
        if k in run and run[k] is not None and (isinstance(run[k], bool) or not isinstance(run[k], int) or run[k] < 1):
            raise InvalidInputError(f"{kind} option {k} must be a positive integer (got {run[k]!r})")
    if run.get("depth_budget", None) not in (None, "auto", "none"):
        raise InvalidInputError(f"{kind} option depth_budget must be 'auto' or 'none' (got {run['depth_budget']!r})")
    if run.get("depth_budget") == "none":
        run["depth_budget"] = None
    if "image_features" in run and run["image_features"] not in IMAGE_FEATURES:
        raise InvalidInputError(f"{kind} option image_features must be one of {IMAGE_FEATURES} "
                                f"(got {run['image_features']!r})")
    on_target = target_model is not None and target_model.device.type != "meta"
    if path:
        if options:
            raise InvalidInputError(f"unknown options for a saved {kind} drafter: {sorted(options)} "
                                    f"(run-time options: {', '.join(RUN_OPTIONS)})")
        drafter = cls.from_pretrained(path, target=target_model, tokenizer=tokenizer,
                                    device=target_model.device if on_target else None)
    else:
        if target_model is None:
            raise InvalidInputError(f"the {kind} drafter needs a path ('{kind}:PATH') or a target to build one for")
        try:
            drafter = cls.from_target(target_model, tokenizer, **options)
        except (TypeError, ValueError) as e:
            raise InvalidInputError(f"bad {kind} drafter options {options!r}: {e}") from e
    for k, v in run.items():
        setattr(drafter, k, v)
    try:
        drafter._check_run_options()
        drafter._check_image_option()
    except ValueError as e:
        raise InvalidInputError(str(e)) from e
    if "depth_budget" in run:
        from mmspec.budget import DepthBudget

        drafter._budget = DepthBudget() if drafter.depth_budget == "auto" else None
    if on_target:
        drafter.to(dtype=target_model.dtype)  # the drafter follows the target's dtype (bf16 checkpoints)
    return drafter
