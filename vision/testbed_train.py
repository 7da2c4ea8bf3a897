"""Training of the testbed target (:mod:`mmspec.vision.testbed`): from scratch, resumed, grown, converted, exported.

Why a module of its own: the runtime (building, loading, batching and evaluating the target, what the driving
pipeline, the workloads, benches and tests use) stays small in :mod:`mmspec.vision.testbed`; everything here
only makes or changes a checkpoint. The direction is one way: this module imports the runtime, and no runtime
module imports this one (``tests/test_testbed.py`` checks it on the import graph).

From-scratch tiny VLMs learn the text prior and ignore the image (DESIGN.md, "The testbed"). Training
therefore adds a dense auxiliary loss on the vision tower, which the renderer makes possible: the
workloads record where every character was drawn, and a linear reader on each merged vision token must
say which characters lie under each of its 2 x 2 patches (multi-hot over printable ASCII). This is
supervision of the *target's* vision tower, used only to build the testbed; say so wherever its numbers
are reported.

Command line: ``python -m mmspec.vision.testbed_train train|export|grow|remerge|ungroup-kv ...`` (evaluation:
``python -m mmspec.vision.testbed eval``).

Example:
    >>> cfg = TargetTrainConfig(steps=2, batch_size=2, size="tiny", out="/tmp/tb")      # doctest: +SKIP
    >>> train_target(cfg)                                                          # doctest: +SKIP
    '/tmp/tb'
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from dataclasses import asdict, dataclass, field

import torch

from mmspec.drafters.eagle import warmup_cosine
from mmspec.train import add_config_arguments, trim_log

from .testbed import MERGE, PATCH, _chat_prompts, build_target, make_batch, merge_size, testbed_workload
from .workloads.bundled import TARGET_DIR

__all__ = ["TargetTrainConfig", "aux_targets", "char_locations", "patch_reading_loss", "reading_targets",
           "ordered_targets", "spelling_table", "train_target", "export_target", "PatchReader", "CHARSET", "PROBES",
           "load_probes", "save_probes", "self_feed_inputs"]

CHARSET = "".join(chr(c) for c in range(32, 127))
_CHAR_INDEX = {c: i for i, c in enumerate(CHARSET)}


def _drawn_chars(example, grid_hw: tuple[int, int], merge: int):
    """Each drawn character inside the patch grid: ``(token, patch within token, centre y, centre x, CHARSET
    index)``. Vertical (rotated) text runs are skipped: their character positions are not along x."""
    h, w = grid_hw
    for run in example.meta.get("runs", []):
        xs, text = run.get("chars"), run["text"]
        x0, y0, x1, y1 = run["box"]
        if not xs or len(xs) != len(text) + 1 or (y1 - y0) > 2 * (x1 - x0):
            continue
        cy = (y0 + y1) / 2
        py = int(cy) // PATCH
        for ch, a, b in zip(text, xs[:-1], xs[1:]):
            idx = _CHAR_INDEX.get(ch)
            cx = (a + b) / 2
            px = int(cx) // PATCH
            if idx is None or not (0 <= py < h and 0 <= px < w):
                continue
            yield (py // merge) * (w // merge) + px // merge, (py % merge) * merge + px % merge, cy, cx, idx


def aux_targets(example, grid_hw: tuple[int, int], merge: int = MERGE) -> torch.Tensor:
    """Multi-hot ``[n_merged, merge**2, len(CHARSET)]``: which characters lie under each patch of each merged token.

    Merged token ``k`` covers merged row ``k // (w / merge)`` and column ``k % (w / merge)`` of the patch grid
    (``grid_hw`` in patches); its patches are ordered row-major, as Qwen2-VL's patch merger reads them.
    Vertical (rotated) text runs are skipped: their character positions are not along x.

    Example:
        >>> from types import SimpleNamespace
        >>> ex = SimpleNamespace(meta={"runs": [{"text": "ab", "box": (0, 0, 24, 20), "chars": [0, 12, 24]}]})
        >>> y = aux_targets(ex, (2, 2))       # one merged token of 2 x 2 patches: "a" in the first, "b" in the second
        >>> y.shape, [[CHARSET[i] for i in patch.nonzero().flatten().tolist()] for patch in y[0]]
        (torch.Size([1, 4, 95]), [['a'], ['b'], [], []])
    """
    h, w = grid_hw
    out = torch.zeros(h // merge * (w // merge), merge * merge, len(CHARSET))
    for k, cell, _, _, idx in _drawn_chars(example, grid_hw, merge):
        if idx:  # index 0, the space, is the blank class
            out[k, cell, idx] = 1.0
    return out


def ordered_targets(example, grid_hw: tuple[int, int], merge: int = MERGE, slots: int = 0) -> torch.Tensor:
    """``[n_merged, slots]`` class ids: the characters drawn in each merged token, in reading order.

    Class ``0`` is *none* (after the token's last character), class ``i + 1`` is ``CHARSET[i]`` (spaces
    included: a copy needs them). A character belongs to the merged token under its centre; characters are
    ordered by their run's line, then left to right, and cut at ``slots`` (default ``4 * merge``). Unlike
    :func:`aux_targets` (which characters lie under each patch, unordered), this says what a reader of the
    token must write, in order: what the text model copies from a vision token.

    Example:
        >>> from types import SimpleNamespace
        >>> ex = SimpleNamespace(meta={"runs": [{"text": "ab", "box": (0, 0, 24, 20), "chars": [0, 12, 24]}]})
        >>> [CHARSET[i - 1] for i in ordered_targets(ex, (2, 2))[0].tolist() if i]
        ['a', 'b']
    """
    h, w = grid_hw
    slots = slots or 4 * merge
    cells: dict = {}
    for k, _, cy, cx, idx in _drawn_chars(example, grid_hw, merge):
        cells.setdefault(k, []).append((cy, cx, idx + 1))
    out = torch.zeros(h // merge * (w // merge), slots, dtype=torch.long)
    for k, chars in cells.items():
        chars.sort()
        out[k, :min(len(chars), slots)] = torch.tensor([c for _, _, c in chars[:slots]])
    return out


def char_locations(example, text: str) -> list:
    """Where each character of ``text`` (an answer) was drawn: ``(x, y)`` centres in pixels, or ``None``.

    Drawn runs are matched longest first to the first free occurrence in ``text``; markup (``#``, ``|``,
    bullets) and characters not drawn (a caption's own words) stay ``None``.

    Example:
        >>> ex = testbed_workload("charts", char_boxes=True).example("test", 1)
        >>> locs = char_locations(ex, ex.target)
        >>> sum(loc is not None for loc in locs) > 0
        True
    """
    locs: list = [None] * len(text)
    for run in sorted(example.meta.get("runs", []), key=lambda r: -len(r["text"])):
        word = run["text"]
        x0, y0, x1, y1 = run["box"]
        xs = run.get("chars")
        if not word.strip():
            continue
        start = text.find(word)
        while start >= 0 and any(locs[j] is not None for j in range(start, start + len(word))):
            start = text.find(word, start + 1)
        if start < 0:
            continue
        for c in range(len(word)):
            x = (xs[c] + xs[c + 1]) / 2 if xs and len(xs) == len(word) + 1 else (x0 + x1) / 2
            locs[start + c] = (x, (y0 + y1) / 2)
    return locs


def reading_targets(processor, examples, batch: dict) -> torch.Tensor:
    """``[batch, seq]`` index of the image token that shows the *next* answer token (``-1`` where none).

    Position ``q`` predicts token ``q + 1``; the target is the merged vision token under that token's first
    drawn character. Used to supervise one attention head per reading layer while the testbed target trains
    (see :func:`train_target`), so the text model learns where to look long before it would by itself.

    Example:
        >>> examples = testbed_workload("docs", char_boxes=True).examples("train", 2)  # doctest: +SKIP
        >>> batch = make_batch(processor, examples)                                       # doctest: +SKIP
        >>> where = reading_targets(processor, examples, batch)                           # doctest: +SKIP
        >>> where.shape == batch["input_ids"].shape, bool((where >= 0).any())          # doctest: +SKIP
        (True, True)
    """
    tok = processor.tokenizer
    ids = batch["input_ids"]
    out = torch.full(ids.shape, -1, dtype=torch.long)
    grids = batch["image_grid_thw"].tolist()
    image_id = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    prompts = _chat_prompts(processor, examples)
    k = 0
    for b, ex in enumerate(examples):
        n_img = len(ex.images)
        if n_img != 1:
            k += n_img
            continue
        _, gh, gw = grids[k]
        k += 1
        # Tokenise as in the batch (the answer follows the prompt; BPE merges across the seam differ otherwise).
        prompt = prompts[b]
        enc = tok(prompt + ex.target, add_special_tokens=False, return_offsets_mapping=True)
        first = next((i for i, (c0, _) in enumerate(enc["offset_mapping"]) if c0 >= len(prompt)), None)
        if first is None:  # the whole answer merged into a token that starts in the prompt (e.g. "\n4.")
            continue
        answer = torch.tensor(enc["input_ids"][first:])
        offsets = [(c0 - len(prompt), c1 - len(prompt)) for c0, c1 in enc["offset_mapping"][first:]]
        labels = batch["labels"][b]
        starts = (labels != -100).nonzero()
        if not len(starts):
            continue
        a0 = int(starts[0])
        if a0 + len(answer) > ids.shape[1] or not torch.equal(ids[b, a0:a0 + len(answer)], answer):
            continue  # the answer tokenised differently in context: no reading target for this example
        image_pos = (ids[b] == image_id).nonzero().flatten()
        locs = char_locations(ex, ex.target)
        merge = merge_size(processor)
        wm = gw // merge
        for t, (c0, c1) in enumerate(offsets):
            loc = next((locs[c] for c in range(c0, c1) if locs[c] is not None), None)
            if loc is None:
                continue
            cell = int(loc[1]) // (PATCH * merge) * wm + int(loc[0]) // (PATCH * merge)
            if 0 <= cell < len(image_pos) and a0 + t >= 1:
                out[b, a0 + t - 1] = image_pos[cell]
    return out


@dataclass
class TargetTrainConfig:
    """Hyper-parameters of :func:`train_target` (saved beside the checkpoint).

    ``aux_weight``: the vision tower's character reader (``aux_loss``: see :func:`patch_reading_loss`);
    ``read_weight``: head 0 of ``read_layers`` (default the two middle layers) must attend to the image token
    showing the next answer token; ``track_weight``: head 1 of the layer before the first reading layer must
    attend to the image token showing the *current* token (a content match, easy to learn, whose output
    carries that cell's row and column: the later pointer then only adds an offset); ``locate_weight``: the
    first text layer must know each image token's row and column. ``init``: start from another
    checkpoint's weights and patch reader (the reader when trained with the same ``aux_loss``; fresh optimizer
    and schedule); ``stop_after``: end this run at that step while the learning-rate schedule still spans
    ``steps`` (resume later to continue it). ``probe_warmup``: for that many first steps the patch reader, the
    locator, the speller and the relay learn on detached features (for a warm start whose probes start
    fresh: ``init`` without a
    ``state.pt``). ``self_feed``: the share of answer input tokens replaced by the model's own
    teacher-forced prediction (from a first, gradient-free pass; see :func:`self_feed_inputs`), so it learns to
    keep reading after its own mistakes instead of drifting into text that is not on the page.
    ``vision_only``: train the vision tower (and its merger) on the patch reader's loss alone, the text model
    frozen and never run: many cheap steps that teach the tower to read before the text model learns to copy.
    ``read_slots``: characters per vision token the ``"ordered"`` reader writes (0: ``4 * merge``).
    ``spell_weight``: a linear probe on the output of the last reading layer must spell the next answer token
    (its first :data:`SPELL` characters, see :func:`spelling_table`): the text model has to carry the characters
    it read off the image into its own states, which a prior-fed model never does on scrambled text.
    ``relay_weight``: what head 0 of each reading layer passes on (its output before the output projection) must
    name the characters of the vision token it is taught to look at, in order (an ``"ordered"`` reader per reading
    layer): the head's values have to carry what the token shows, not only where it is.
    ``device``: ``"cpu"``, ``"cuda"`` (or ``"cuda:N"``) or ``"auto"`` (cuda when available): the model, the probes
    and every batch tensor live there. ``amp``: ``"bf16"`` autocasts forward and losses to bfloat16 (master
    weights and the saved checkpoint stay float32; refused on a GPU without native bfloat16), ``"none"`` runs
    float32; ``"auto"``: bf16 on a cuda device that has it, none otherwise (and on the cpu).
    ``data_workers``: processes that render the items and build each step's inputs (batch, reading and reader
    targets) ahead of the loop, so the device never waits on Pillow; 0 builds them in the loop. The items of a
    step depend on the step alone: any number of workers logs the same losses. ``max_minutes``: stop cleanly
    (checkpoint saved) once that much wall-clock time has passed since the call began (0: no budget).
    ``seed``: also draws the fresh probes (reader, locator, speller, relay; since 2026-12-02, before that from the
    global RNG after :func:`build_target`), so runs from before 2026-12-02 without ``--init`` probes do not
    reproduce their probe initialisation bit for bit.

    Example:
        >>> cfg = TargetTrainConfig(out="/tmp/tb", size="tiny", steps=20, stop_after=10, device="auto")
        >>> cfg.batch_size, cfg.aux_loss, cfg.workload_options
        (8, 'softmax', {'docs': {}, 'charts': {}})
    """

    out: str = "testbed-target"
    size: str = "small"
    steps: int = 3000
    batch_size: int = 8
    lr: float = 1e-3
    warmup: int = 100
    aux_weight: float = 1.0
    aux_loss: str = "softmax"
    read_weight: float = 0.5
    read_layers: str = ""
    track_weight: float = 0.0
    locate_weight: float = 0.5
    init: str = ""
    stop_after: int = 0
    probe_warmup: int = 0
    self_feed: float = 0.0
    docs_fraction: float = 0.5
    vision_only: bool = False
    read_slots: int = 0
    spell_weight: float = 0.0
    relay_weight: float = 0.0
    save_every: int = 250
    seed: int = 0
    threads: int = 0
    device: str = "cpu"
    amp: str = "auto"
    data_workers: int = 0
    max_minutes: float = 0.0
    tokenizer_texts: int = 3000
    vocab_size: int = 1024
    workload_options: dict = field(default_factory=lambda: {"docs": {}, "charts": {}})


def patch_reading_loss(logits, targets, kind: str = "softmax", blank_weight: float = 0.1) -> tuple:
    """The vision tower's character-reading loss and its top-1 accuracy on patches that show characters.

    ``logits[n, cells, C]`` from :class:`PatchReader`, ``targets[n, cells, C]`` multi-hot from :func:`aux_targets`
    (index 0, the space, is never a target: it serves as the *blank* class of patches without characters).
    ``"softmax"``: cross-entropy of each patch against the uniform distribution over its characters (blank
    for empty patches, weighted ``blank_weight``). ``"bce"``: the independent sigmoids of the first bundled
    target, which, averaged over 95 mostly-negative classes, barely beat a constant (0.048 against 0.088
    for logits of -6 everywhere, with 6% top-1 on patches with characters): the tower never learned to read.
    ``"ordered"``: ``targets[n, slots]`` from :func:`ordered_targets` and ``logits[n, slots, C + 1]``; the summed
    cross-entropy of the slots of each token, and the accuracy over slots that hold a character.

    Example:
        >>> y = torch.zeros(1, 4, 5); y[0, 0, 3] = 1
        >>> logits = torch.zeros(1, 4, 5); logits[0, 0, 3] = 9; logits[0, 1:, 0] = 9
        >>> loss, acc = patch_reading_loss(logits, y); round(loss.item(), 3), acc
        (0.001, 1.0)
    """
    if kind == "ordered":
        # Every slot is a class (0: no more characters); tokens that show nothing weigh ``blank_weight``.
        has = targets[..., 0] > 0
        ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
        ce = ce.view(targets.shape).sum(-1)
        w = torch.where(has, 1.0, blank_weight)
        drawn = targets > 0
        acc = (logits.argmax(-1)[drawn] == targets[drawn]).float().mean().item() if drawn.any() else 0.0
        return (w * ce).sum() / w.sum().clamp(min=1e-6), acc
    has = targets.sum(-1) > 0
    hit = targets.gather(-1, logits.argmax(-1, keepdim=True))[..., 0] > 0
    acc = hit[has].float().mean().item() if has.any() else 0.0
    if kind == "bce":
        pos_weight = torch.tensor(8.0, device=logits.device)
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, targets, pos_weight=pos_weight), acc
    logp = torch.log_softmax(logits, -1)
    want = targets / targets.sum(-1, keepdim=True).clamp(min=1)
    read = -(want * logp).sum(-1)[has].mean() if has.any() else logits.sum() * 0
    blank = -logp[..., 0][~has].mean() if (~has).any() else logits.sum() * 0
    return read + blank_weight * blank, acc


class PatchReader(torch.nn.Module):
    """A linear reader on merged vision tokens: logits ``[n, merge**2, n_classes]``, one row per patch (the
    auxiliary vision-tower loss of testbed targets; used in training only, never saved with the target).

    Example:
        >>> PatchReader(8, 5)(torch.zeros(3, 8)).shape
        torch.Size([3, 4, 5])
    """

    def __init__(self, hidden: int, n_classes: int = len(CHARSET), merge: int = MERGE, cells: int = 0):
        super().__init__()
        self.n_classes, self.cells = n_classes, cells or merge * merge
        self.proj = torch.nn.Linear(hidden, self.cells * n_classes)

    def forward(self, h):
        return self.proj(h).view(h.shape[0], self.cells, self.n_classes)


PROBES = ("reader", "locator", "speller", "relay")


def load_probes(path: str, missing_ok: bool = False) -> dict:
    """The training probes (:data:`PROBES`: patch reader, locator, speller, relay; state dicts, on the CPU) of a
    checkpoint folder: its ``state.pt`` (a training run's: optimizer and step are left out), else its ``probes.pt``
    (what :func:`save_probes` writes, e.g. ``results/vision/train_gpu.sh``). ``path`` may also name the file.

    Loaded with ``weights_only=True`` and ``map_location="cpu"``: a checkpoint written on a GPU reads here.
    Neither file: :class:`~mmspec.errors.InvalidInputError`, or ``{}`` with ``missing_ok``.

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> path = save_probes({"reader": PatchReader(8, 5), "optimizer": {}, "step": 3}, f"{folder}/probes.pt")
        >>> probes = load_probes(folder)
        >>> sorted(probes), probes["reader"]["proj.weight"].shape
        (['reader'], torch.Size([20, 8]))
        >>> load_probes(f"{folder}/none", missing_ok=True)
        {}
    """
    from mmspec.errors import InvalidInputError

    files = [path] if os.path.isfile(path) else [os.path.join(path, n) for n in ("state.pt", "probes.pt")]
    found = next((f for f in files if os.path.isfile(f)), None)
    if found is None:
        if missing_ok:
            return {}
        raise InvalidInputError(f"no probes in {path}: neither state.pt (a training run's) nor probes.pt "
                                f"(train_gpu.sh's) is there")
    saved = torch.load(found, map_location="cpu", weights_only=True)
    return {k: saved[k] for k in PROBES if k in saved}


def save_probes(probes: dict, path: str) -> str:
    """Write the :data:`PROBES` among ``probes`` (state dicts or modules; anything else, e.g. an optimizer or a
    step, is left out) to the file ``path``, on the CPU, atomically (a temporary file, then a rename); returns
    ``path``. Read back with :func:`load_probes`.

    Example:
        >>> save_probes({"locator": _Locator(8), "step": 7}, "/tmp/run/probes.pt")     # doctest: +SKIP
        '/tmp/run/probes.pt'
    """
    out = {}
    for k in PROBES:
        if k in probes:
            state = probes[k].state_dict() if isinstance(probes[k], torch.nn.Module) else probes[k]
            out[k] = {n: t.detach().cpu() for n, t in state.items()}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    torch.save(out, path + ".tmp")
    os.replace(path + ".tmp", path)
    return path


def _ordered_reader(probes: dict, hidden: int, merge: int, where: str = "the checkpoint") -> PatchReader:
    """The ``"ordered"`` patch reader among ``probes`` (:func:`load_probes`), built and loaded; a clear
    :class:`~mmspec.errors.InvalidInputError` when there is none (a softmax or bce reader has ``merge**2`` x 95
    outputs, an ordered one ``slots`` x 96). Used by the probe scripts under ``results/vision/probes``."""
    from mmspec.errors import InvalidInputError

    if "reader" not in probes:
        raise InvalidInputError(f"{where} has no patch reader among its probes")
    rows, width = probes["reader"]["proj.weight"].shape
    if rows % (len(CHARSET) + 1) or width != hidden:
        raise InvalidInputError(
            f"the patch reader of {where} is not an 'ordered' one ({rows} x {width} weights; an ordered reader has "
            f"slots x {len(CHARSET) + 1} rows of width {hidden}): train it with --aux-loss ordered")
    reader = PatchReader(hidden, len(CHARSET) + 1, merge, cells=rows // (len(CHARSET) + 1))
    reader.load_state_dict(probes["reader"])
    return reader


class _Locator(torch.nn.Module):
    """Row and column of each image token, read from the text model's first-layer output (training only).

    Qwen2-VL's vision features carry no absolute position (2-D RoPE is relative), but the causal text model
    can count along the raster order of the image tokens; this probe makes it do so early, so later layers
    can address "the cell right of the one just read" (what :func:`reading_targets` supervises).
    """

    ROWS, COLS = 32, 32  # as many as any workload image has (448 / 14 = 32 rows of single patches at merge 1)

    def __init__(self, hidden: int, merge: int = MERGE):
        super().__init__()
        self.merge = merge
        self.proj = torch.nn.Linear(hidden, self.ROWS + self.COLS)

    def loss(self, h, batch, image_id: int):
        ids = batch["input_ids"]
        out = []
        for b, (_, gh, gw) in enumerate(batch["image_grid_thw"].tolist()):  # one image per example
            pos = (ids[b] == image_id).nonzero().flatten()
            wm = gw // self.merge
            cell = torch.arange(len(pos), device=h.device)
            logits = self.proj(h[b, pos])
            out.append(torch.nn.functional.cross_entropy(logits[:, :self.ROWS], (cell // wm).clamp(max=self.ROWS - 1))
                       + torch.nn.functional.cross_entropy(logits[:, self.ROWS:], (cell % wm).clamp(max=self.COLS - 1)))
        return torch.stack(out).mean()


SPELL = 4


def spelling_table(tokenizer, width: int = SPELL) -> torch.Tensor:
    """``[vocab, width]`` class ids spelling each token: ``CHARSET`` index + 1 per character, ``0`` after its end
    (and from the first character outside ``CHARSET``, e.g. a newline). Special tokens (the end token, image
    placeholders) spell nothing: their text, e.g. ``<|im_end|>``, is markup, not something drawn on a page.

    Example:
        >>> from transformers import PreTrainedTokenizerFast
        >>> from mmspec.demo import train_tokenizer
        >>> tok = PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(["the cat sat"] * 20, 300))
        >>> cat = tok("the cat", add_special_tokens=False)["input_ids"][-1]
        >>> "".join(CHARSET[i - 1] for i in spelling_table(tok)[cat] if i)
        'cat'
    """
    out = torch.zeros(len(tokenizer), width, dtype=torch.long)
    special = set(tokenizer.all_special_ids)
    for v in range(len(tokenizer)):
        if v in special:
            continue
        for j, ch in enumerate(tokenizer.decode([v])[:width]):
            if ch not in _CHAR_INDEX:
                break
            out[v, j] = _CHAR_INDEX[ch] + 1
    return out


class _Speller(torch.nn.Module):
    """Spells the next answer token from a text layer's state (training only; see ``spell_weight``)."""

    def __init__(self, hidden: int, width: int = SPELL):
        super().__init__()
        self.width = width
        self.proj = torch.nn.Linear(hidden, width * (len(CHARSET) + 1))

    def loss(self, h, labels, table) -> tuple:
        nxt = labels[:, 1:]
        ok = nxt != -100
        target = table[nxt.clamp(min=0)]
        ok &= target[..., 0] > 0  # the end token and tokens spelled by no printable character teach nothing
        if not ok.any():
            return h.sum() * 0, 0.0
        logits = self.proj(h[:, :-1][ok]).view(-1, self.width, len(CHARSET) + 1)
        y = target[ok]
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
        return loss, (logits.argmax(-1) == y).all(-1).float().mean().item()


def self_feed_inputs(input_ids, labels, predicted, share: float, generator=None) -> tuple:
    """``input_ids`` with a random ``share`` of the answer tokens replaced by the model's own predictions.

    ``predicted[b, q]`` is what the model predicted at position ``q`` for position ``q + 1`` (teacher-forced
    argmax); an answer position ``q + 1`` (``labels != -100``, the first answer token excepted: it follows the
    prompt) takes it with probability ``share``. Labels stay the reference: the model learns that after a
    misread token the page, not its last token, says what comes next (scheduled sampling in one extra forward,
    Mihaylova & Martins 2019). Token positions do not move, so reading targets stay valid. Returns the new ids
    and the share of answer tokens that actually changed.

    Example:
        >>> ids = torch.tensor([[7, 1, 2, 3, 4]]); labels = torch.tensor([[-100, 1, 2, 3, 4]])
        >>> pred = torch.tensor([[1, 9, 9, 9]])   # right first, then wrong
        >>> new, changed = self_feed_inputs(ids, labels, pred, 1.0)
        >>> new.tolist(), changed
        ([[7, 1, 9, 9, 9]], 0.75)
    """
    answer = labels[:, 1:] != -100
    answer &= labels[:, :-1] != -100  # the first answer token follows the prompt, not a prediction
    # Drawn on the CPU (a CPU generator), then moved: the same draws on any device.
    pick = (torch.rand(answer.shape, generator=generator) < share).to(answer.device)
    swap = answer & pick & (predicted != input_ids[:, 1:])
    out = input_ids.clone()
    out[:, 1:][swap] = predicted[swap]
    n_answer = int((labels != -100).sum())
    return out, int(swap.sum()) / max(n_answer, 1)


def _examples(cfg: TargetTrainConfig, step: int, workloads: dict) -> list:
    """Training batch ``step``: a fixed, resumable sequence of (workload, index) pairs."""
    n_docs = round(cfg.batch_size * cfg.docs_fraction)
    docs = workloads["docs"].examples("train", n_docs, start=step * n_docs)
    charts = workloads["charts"].examples("train", cfg.batch_size - n_docs, start=step * (cfg.batch_size - n_docs))
    return docs + charts


def _train_workloads(cfg: TargetTrainConfig) -> dict:
    return {name: testbed_workload(name, char_boxes=True, **cfg.workload_options.get(name, {}))
            for name in ("docs", "charts")}


def _step_inputs(cfg: TargetTrainConfig, step: int, workloads: dict, processor, merge: int, slots: int,
                 want_where: bool, want_spelled: bool) -> dict:
    """Everything training step ``step`` needs from its items, built on the CPU: the processor batch (labels
    included), the reading targets (``want_where``), each example's ordered targets (``want_spelled`` or an
    ``"ordered"`` reader) and the patch reader's targets."""
    ordered = cfg.aux_loss == "ordered"
    examples = _examples(cfg, step, workloads)
    batch = make_batch(processor, examples)
    # Reading targets come from the reference tokens (they are matched against the batch's ids).
    where = reading_targets(processor, examples, batch) if want_where else None
    grids = [tuple(g) for g in batch["image_grid_thw"][:, 1:].tolist()]  # one image per example
    spelled = [ordered_targets(ex, g, merge, slots) for ex, g in zip(examples, grids)] if (
        ordered or want_spelled) else None
    aux_y = torch.cat(spelled if ordered else [aux_targets(ex, g, merge) for ex, g in zip(examples, grids)])
    return {"batch": batch, "where": where, "spelled": spelled, "aux_y": aux_y}


class _StepData(torch.utils.data.Dataset):
    """Item ``i``: :func:`_step_inputs` of step ``start + i`` (what :func:`train_target`'s data workers build).

    The workloads are built lazily in whichever process reads the first item, so each worker has its own.
    """

    def __init__(self, cfg: TargetTrainConfig, start: int, end: int, processor, merge: int, slots: int,
                 want_where: bool, want_spelled: bool):
        self.cfg, self.start, self.end, self.processor = cfg, start, end, processor
        self.merge, self.slots, self.want_where, self.want_spelled = merge, slots, want_where, want_spelled
        self._workloads = None

    def __len__(self) -> int:
        return max(self.end - self.start, 0)

    def __getitem__(self, i: int) -> dict:
        if self._workloads is None:
            self._workloads = _train_workloads(self.cfg)
        return _step_inputs(self.cfg, self.start + i, self._workloads, self.processor, self.merge, self.slots,
                            self.want_where, self.want_spelled)


def _to_device(x, device):
    """``x`` (a tensor, or a dict / list of them, ``None`` kept) on ``device``."""
    if torch.is_tensor(x):
        return x.to(device, non_blocking=True)
    if isinstance(x, dict):
        return {k: _to_device(v, device) for k, v in x.items()}
    if isinstance(x, list):
        return [_to_device(v, device) for v in x]
    return x


def _train_device(cfg: TargetTrainConfig) -> tuple:
    """``(torch.device, amp dtype or None)`` of ``cfg``, checked before any work."""
    from mmspec.errors import InvalidInputError

    name = cfg.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if not re.fullmatch(r"cpu|cuda(:[0-9]+)?", name):  # torch.device("cuda:x") would raise a RuntimeError
        raise InvalidInputError(f"device must be 'cpu', 'cuda', 'cuda:N' or 'auto', got {cfg.device!r}")
    if cfg.amp not in ("auto", "bf16", "none"):
        raise InvalidInputError(f"amp must be 'auto', 'bf16' or 'none', got {cfg.amp!r}")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InvalidInputError(f"device {cfg.device!r} asked for, but torch sees no CUDA device here")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise InvalidInputError(f"device {cfg.device!r} asked for, but torch sees {count} CUDA device(s) "
                                    f"(cuda:0 to cuda:{count - 1})")
        bf16 = _cuda_bf16(device.index or 0)
        if cfg.amp == "bf16" and not bf16:
            raise InvalidInputError(f"amp 'bf16' asked for, but {cfg.device!r} has no native bfloat16 support "
                                    f"(torch.cuda.is_bf16_supported): use amp 'none' (float32)")
        amp = cfg.amp if cfg.amp != "auto" else ("bf16" if bf16 else "none")
    else:
        amp = cfg.amp if cfg.amp != "auto" else "none"
    return device, (torch.bfloat16 if amp == "bf16" else None)


def _cuda_bf16(index: int) -> bool:
    """Whether CUDA device ``index`` computes in bfloat16 natively (emulated bf16 would only be slower)."""
    with torch.cuda.device(index):
        return torch.cuda.is_bf16_supported(including_emulation=False)


def train_target(cfg: TargetTrainConfig, progress: bool = True) -> str:
    """Train (or resume) the testbed target; writes ``save_pretrained`` checkpoints under ``cfg.out``.

    Resumes from ``cfg.out/state.pt`` (optimizer, step; loaded with ``weights_only=True`` onto the CPU, so a
    checkpoint written on a GPU resumes on a CPU and back) when present. Returns the output folder.

    Example:
        >>> train_target(TargetTrainConfig(out="/tmp/tb", size="tiny", steps=2, batch_size=2))   # doctest: +SKIP
        '/tmp/tb'
    """
    from tqdm import tqdm
    from transformers import AutoProcessor, Qwen2VLForConditionalGeneration

    from mmspec.errors import InvalidInputError

    if cfg.track_weight and not cfg.read_weight:
        raise InvalidInputError("track_weight needs read_weight > 0 (the tracked head sits below the reading layers)")
    if cfg.aux_loss not in ("softmax", "bce", "ordered"):
        raise InvalidInputError(f"aux_loss must be 'softmax', 'bce' or 'ordered', got {cfg.aux_loss!r}")
    if cfg.vision_only and not cfg.aux_weight:
        raise InvalidInputError("vision_only trains the tower on the patch reader's loss: aux_weight must be > 0")
    if not 0.0 <= cfg.self_feed <= 1.0:
        raise InvalidInputError(f"self_feed must be in [0, 1], got {cfg.self_feed}")
    if cfg.data_workers < 0 or cfg.max_minutes < 0:
        raise InvalidInputError(f"data_workers and max_minutes must be >= 0, got {cfg.data_workers}, {cfg.max_minutes}")
    device, amp_dtype = _train_device(cfg)
    began = time.monotonic()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    os.makedirs(cfg.out, exist_ok=True)
    state_path = os.path.join(cfg.out, "state.pt")
    resume = os.path.isfile(state_path) and os.path.isfile(os.path.join(cfg.out, "model.safetensors"))
    if resume or cfg.init:
        src = cfg.out if resume else cfg.init
        model = Qwen2VLForConditionalGeneration.from_pretrained(src, dtype=torch.float32)
        processor = AutoProcessor.from_pretrained(src)
    else:
        model, processor = build_target(cfg.size, cfg.tokenizer_texts, cfg.vocab_size, seed=cfg.seed)
    model.to(device)
    merge = merge_size(processor)
    ordered = cfg.aux_loss == "ordered"
    slots = cfg.read_slots or 4 * merge
    tc = model.config.text_config
    head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
    # Fresh probes drawn from cfg.seed on the CPU, whatever the caller's RNG and the device: two runs from the
    # same --init start alike (a process's own seed is random), on a CPU as on a GPU.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        reader = PatchReader(tc.hidden_size, len(CHARSET) + ordered, merge, cells=slots if ordered else 0)
        locator = _Locator(tc.hidden_size, merge)
        speller = _Speller(tc.hidden_size)
        relay = torch.nn.ModuleList([PatchReader(head_dim, len(CHARSET) + 1, merge, cells=slots)
                                     for _ in range(max(len(_read_layers(cfg, tc.num_hidden_layers)), 1))])
    reader, locator, speller, relay = (m.to(device) for m in (reader, locator, speller, relay))
    trained = model.model.visual if cfg.vision_only else model
    if cfg.vision_only:
        model.requires_grad_(False)
        trained.requires_grad_(True)
    params = list(trained.parameters()) + list(reader.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.01)
    start = 0
    loc_opt = torch.optim.AdamW(locator.parameters(), lr=cfg.lr)
    spell_opt = torch.optim.AdamW(speller.parameters(), lr=cfg.lr)
    relay_opt = torch.optim.AdamW(relay.parameters(), lr=cfg.lr)
    if resume:
        saved = torch.load(state_path, map_location="cpu", weights_only=True)  # load_state_dict moves it
        opt.load_state_dict(saved["optimizer"])
        reader.load_state_dict(saved["reader"])
        if "locator" in saved:
            locator.load_state_dict(saved["locator"])
            loc_opt.load_state_dict(saved["locator_optimizer"])
        if "speller" in saved:
            speller.load_state_dict(saved["speller"])
            spell_opt.load_state_dict(saved["speller_optimizer"])
        if "relay" in saved:
            relay.load_state_dict(saved["relay"])
            relay_opt.load_state_dict(saved["relay_optimizer"])
        start = int(saved["step"])
    elif cfg.init:
        # A reader trained with the tower keeps the tower's features meaningful from the first step; one
        # trained under the other loss (sigmoids vs softmax) would be a bad start, so it is left out.
        init_loss = None
        if os.path.isfile(os.path.join(cfg.init, "train_config.json")):
            with open(os.path.join(cfg.init, "train_config.json")) as f:
                init_loss = json.load(f).get("aux_loss", "bce")
        # probes.pt: the probes alone, what results/vision/train_gpu.sh brings back (its state.pt is too big).
        saved = load_probes(cfg.init, missing_ok=True)
        if "locator" in saved:  # whatever the reader; its optimizer state stays behind: a new run gets a fresh one
            locator.load_state_dict(saved["locator"])
        if "speller" in saved:
            speller.load_state_dict(saved["speller"])
        mine = relay.state_dict()
        if "relay" in saved and saved["relay"].keys() == mine.keys() and all(
                saved["relay"][k].shape == v.shape for k, v in mine.items()):
            relay.load_state_dict(saved["relay"])
        # A remerged target keeps no reader (its tokens cover other patches); an ordered reader's slots must match.
        if "reader" in saved and init_loss == cfg.aux_loss and saved["reader"]["proj.weight"].shape == \
                reader.proj.weight.shape:
            reader.load_state_dict(saved["reader"])
        elif progress:
            print(f"testbed: patch reader starts fresh ({cfg.init} has no state.pt or probes.pt with an {cfg.aux_loss} "
                  "reader)")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(cfg.warmup, cfg.steps))
    for _ in range(start):
        sched.step()
    captured = {}
    hooks = [model.model.visual.register_forward_hook(lambda m, a, out: captured.__setitem__("h", out.pooler_output))]
    read_layers = [] if cfg.vision_only else _read_layers(cfg, model.config.text_config.num_hidden_layers)
    image_id = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    locate_weight = 0.0 if cfg.vision_only else cfg.locate_weight
    spell_weight = 0.0 if cfg.vision_only or not read_layers else cfg.spell_weight
    relay_weight = cfg.relay_weight if cfg.read_weight and read_layers else 0.0
    if relay_weight:
        for li in read_layers:
            hooks.append(model.model.language_model.layers[li].self_attn.o_proj.register_forward_pre_hook(
                lambda m, args, li=li: captured.__setitem__(("heads", li), args[0])))
    if spell_weight:
        spell_table = spelling_table(processor.tokenizer).to(device)
        hooks.append(model.model.language_model.layers[max(read_layers)].register_forward_hook(
            lambda m, a, out: captured.__setitem__("spell", out[0] if isinstance(out, tuple) else out)))
    if locate_weight:
        hooks.append(model.model.language_model.layers[0].register_forward_hook(
            lambda m, a, out: captured.__setitem__("layer0", out[0] if isinstance(out, tuple) else out)))
    if cfg.read_weight and read_layers:
        # Attention probabilities come out of the eager kernel only; the saved config goes back to sdpa.
        model.set_attn_implementation({"text_config": "eager"})
        track_layer = max(read_layers[0] - 1, 0)
        for li in sorted(set(read_layers) | ({track_layer} if cfg.track_weight else set())):
            hooks.append(model.model.language_model.layers[li].self_attn.register_forward_hook(
                lambda m, a, out, li=li: captured.__setitem__(("attn", li), out[1])))
    feed_rng = torch.Generator().manual_seed(cfg.seed * 1_000_003 + start)  # a resumed run draws anew
    log_path = os.path.join(cfg.out, "train_log.jsonl")
    trim_log(log_path, start)  # a killed job may have logged steps past its last checkpoint
    model.train()
    end = min(cfg.steps, cfg.stop_after) if cfg.stop_after else cfg.steps  # the schedule still spans cfg.steps
    want_where = bool(cfg.read_weight and read_layers)
    data = _StepData(cfg, start, end, processor, merge, slots, want_where, bool(relay_weight))
    if cfg.data_workers:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # each worker tokenises on its own
    # Workers keep the step order (a map-style dataset, no shuffling): any worker count gives the same items.
    loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=cfg.data_workers,
                                         prefetch_factor=2 if cfg.data_workers else None,
                                         pin_memory=device.type == "cuda")
    zero = torch.zeros((), device=device)
    bar = tqdm(range(start, end), initial=start, total=cfg.steps, disable=not progress, desc="target")
    items = iter(loader)
    try:
        for step in bar:
            t0 = time.perf_counter()
            inputs = _to_device(next(items), device)
            data_sec = time.perf_counter() - t0  # the loop waiting for its inputs: more workers when it is not ~0
            batch, where, spelled, aux_y = inputs["batch"], inputs["where"], inputs["spelled"], inputs["aux_y"]
            fed = 0.0
            with torch.autocast(device.type, dtype=amp_dtype) if amp_dtype else contextlib.nullcontext():
                if cfg.self_feed and not cfg.vision_only:
                    with torch.no_grad():
                        first = model(**{k: v for k, v in batch.items() if k != "labels"}).logits[:, :-1].argmax(-1)
                    batch["input_ids"], fed = self_feed_inputs(batch["input_ids"], batch["labels"], first,
                                                               cfg.self_feed, feed_rng)
                if cfg.vision_only:
                    model.model.visual(batch["pixel_values"], grid_thw=batch["image_grid_thw"])
                    lm_loss = zero
                else:
                    lm_loss = model(**batch).loss
                # While the probes are new, they learn on detached features: a random probe's gradient would
                # otherwise push a trained tower (and first layer) around before the probe knows anything.
                warm = step < cfg.probe_warmup
                aux_logits = reader(captured["h"].detach() if warm else captured["h"])
                aux, aux_acc = patch_reading_loss(aux_logits.float(), aux_y, cfg.aux_loss)
                loss = lm_loss + cfg.aux_weight * aux
                read = track = zero
                if want_where:
                    b_idx, q_idx = (where >= 0).nonzero(as_tuple=True)
                    if len(b_idx):
                        # Head 0 of each reading layer must put its attention on the image token being read.
                        read = torch.stack([-torch.log(captured[("attn", li)][b_idx, 0, q_idx, where[b_idx, q_idx]]
                                                       .float() + 1e-6).mean() for li in read_layers]).mean()
                        loss = loss + cfg.read_weight * read
                    if cfg.track_weight:
                        # Position q shows the token predicted at q - 1: its cell is where[q - 1].
                        current = torch.full_like(where, -1)
                        current[:, 1:] = where[:, :-1]
                        cb, cq = (current >= 0).nonzero(as_tuple=True)
                        if len(cb):
                            track = -torch.log(captured[("attn", track_layer)][cb, 1, cq, current[cb, cq]].float()
                                               + 1e-6).mean()
                            loss = loss + cfg.track_weight * track
                layer0 = captured["layer0"].detach() if warm and locate_weight else captured.get("layer0")
                locate = locator.loss(layer0, batch, image_id) if locate_weight else zero
                loss = loss + locate_weight * locate
                spell_h = captured.get("spell")
                spell_h = spell_h.detach() if warm and spell_h is not None else spell_h  # a fresh probe: see warm
                spell, spell_acc = (speller.loss(spell_h, batch["labels"], spell_table) if spell_weight
                                    else (zero, 0.0))
                loss = loss + spell_weight * spell
                relay_loss, relay_acc = zero, 0.0
                if relay_weight:
                    relay_loss, relay_acc = _relay_loss(relay, captured, read_layers, where, batch["input_ids"],
                                                        spelled, image_id, head_dim, detach=warm)
                    loss = loss + relay_weight * relay_loss
            opt.zero_grad(set_to_none=True)
            loc_opt.zero_grad(set_to_none=True)
            spell_opt.zero_grad(set_to_none=True)
            relay_opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            loc_opt.step()
            if spell_weight:
                spell_opt.step()
            if relay_weight:
                relay_opt.step()
            sched.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # kernels run asynchronously: time the step, not its launch
            rec = {"step": step + 1, "lm_loss": round(lm_loss.item(), 4), "aux_loss": round(aux.item(), 4),
                   "aux_acc": round(aux_acc, 4),
                   "read_loss": round(read.item(), 4), "track_loss": round(track.item(), 4),
                   "locate_loss": round(locate.item(), 4), "self_fed": round(fed, 4),
                   "spell_loss": round(spell.item(), 4), "spell_acc": round(spell_acc, 4),
                   "relay_loss": round(relay_loss.item(), 4), "relay_acc": round(relay_acc, 4),
                   "lr": sched.get_last_lr()[0], "sec": round(time.perf_counter() - t0, 3),
                   "data_sec": round(data_sec, 3)}
            bar.set_postfix(lm=rec["lm_loss"], aux=rec["aux_loss"], acc=rec["aux_acc"], read=rec["read_loss"],
                            track=rec["track_loss"], loc=rec["locate_loss"], refresh=False)
            with open(log_path, "a") as f:
                f.write(json.dumps(rec) + "\n")
            out_of_time = bool(cfg.max_minutes) and time.monotonic() - began >= 60 * cfg.max_minutes
            if (step + 1) % cfg.save_every == 0 or step + 1 == end or out_of_time:
                _save(model, processor, reader, opt, step + 1, cfg, locator, loc_opt, speller, spell_opt, relay,
                      relay_opt)
            if out_of_time:
                if progress:
                    print(f"testbed: {cfg.max_minutes} minutes spent: stopped and saved at step {step + 1}")
                break
    finally:
        del items  # ends the workers of a run stopped early
        for h in hooks:
            h.remove()
        model.set_attn_implementation({"text_config": "sdpa"})
    model.eval()
    return cfg.out


def _relay_loss(relay, captured, read_layers, where, input_ids, spelled, image_id, head_dim,
                detach: bool = False) -> tuple:
    """The ``relay_weight`` loss: head 0's output at each reading position spells the vision token it should read.

    ``spelled[b]``: :func:`ordered_targets` of example ``b``'s image, whose tokens sit contiguously in its row.
    """
    b_idx, q_idx = (where >= 0).nonzero(as_tuple=True)
    if not len(b_idx):
        return torch.zeros(()), 0.0
    first = (input_ids == image_id).int().argmax(-1)  # each row's first image token
    y = torch.stack([spelled[b][where[b, q] - first[b]] for b, q in zip(b_idx.tolist(), q_idx.tolist())])
    losses, hits = [], []
    for reader, li in zip(relay, read_layers):
        heads = captured[("heads", li)]
        logits = reader((heads.detach() if detach else heads)[b_idx, q_idx, :head_dim])
        losses.append(torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()))
        drawn = y > 0
        hits.append((logits.argmax(-1)[drawn] == y[drawn]).float().mean().item() if drawn.any() else 0.0)
    return torch.stack(losses).mean(), sum(hits) / len(hits)


def _save(model, processor, reader, opt, step: int, cfg: TargetTrainConfig, locator, loc_opt, speller=None,
          spell_opt=None, relay=None, relay_opt=None) -> None:
    """Checkpoint atomically enough for a killed job: weights first, then the step that points at them."""
    training_impl = model.config.text_config._attn_implementation
    model.set_attn_implementation({"text_config": "sdpa"})
    model.save_pretrained(cfg.out)
    model.set_attn_implementation({"text_config": training_impl})
    processor.save_pretrained(cfg.out)
    tmp = os.path.join(cfg.out, "state.pt.tmp")
    state = {"optimizer": opt.state_dict(), "reader": reader.state_dict(), "step": step,
             "locator": locator.state_dict(), "locator_optimizer": loc_opt.state_dict()}
    if cfg.spell_weight and speller is not None:
        state.update(speller=speller.state_dict(), speller_optimizer=spell_opt.state_dict())
    if cfg.relay_weight and relay is not None:
        state.update(relay=relay.state_dict(), relay_optimizer=relay_opt.state_dict())
    torch.save(state, tmp)
    os.replace(tmp, os.path.join(cfg.out, "state.pt"))
    with open(os.path.join(cfg.out, "train_config.json"), "w") as f:
        json.dump(asdict(cfg), f, indent=2)


def _read_layers(cfg: TargetTrainConfig, n_layers: int) -> list[int]:
    """Layers whose head 0 is taught to read (default: the two middle layers)."""
    if cfg.read_layers:
        return [int(x) for x in cfg.read_layers.split(",")]
    return [n_layers // 2 - 1, n_layers // 2] if n_layers >= 2 else [0]


def export_target(src: str, out: str = TARGET_DIR, dtype=torch.bfloat16) -> str:
    """Write the shippable copy of a trained target: weights stored in ``dtype`` (half the bytes of float32),
    ``config.json`` saying float32 so ``from_pretrained`` upcasts, and the training log and config beside it.

    The bundled target *is* this rounded model: drafters are trained against it, not against ``src``.

    Example:
        >>> export_target(".mmspec_cache/testbed-read", "/tmp/testbed-vlm")                # doctest: +SKIP
    """
    from transformers import AutoProcessor, Qwen2VLForConditionalGeneration

    from mmspec.checkpoints import copy_training_files, save_hf_compact

    model = Qwen2VLForConditionalGeneration.from_pretrained(src, dtype=torch.float32)
    processor = AutoProcessor.from_pretrained(src)
    os.makedirs(out, exist_ok=True)
    save_hf_compact(model, out, dtype)
    processor.save_pretrained(out)
    copy_training_files(src, out)
    return out


def grow_target(src: str, out: str, text_layers: int = 0, vision_depth: int = 0, progress: bool = True) -> str:
    """A deeper copy of the target in ``src`` that computes exactly the same function: ``text_layers`` decoder
    layers and ``vision_depth`` vision blocks in all (0: unchanged), the new ones appended after the last, each a
    copy of the last one with its residual outputs zeroed (attention ``o_proj`` / ``proj`` and MLP ``down_proj`` /
    ``fc2``), so it starts as the identity and gradients reach its output projections from the first step.

    Why appended: the supervised reading and tracking layers keep their indices (``read_layers``) and the
    locator still reads layer 0. Why copies and not random weights: a zeroed output projection only passes
    gradient to what feeds it once it moves, and then a copy of a trained block is a better start than noise.
    The patch reader and locator of ``src`` (its ``state.pt``) are carried over, so ``train --init OUT`` keeps
    them (no ``--probe-warmup`` needed).

    Example:
        >>> grow_target("vision/assets/testbed-vlm", "/tmp/grown", text_layers=8, vision_depth=6)  # doctest: +SKIP
    """
    from transformers import AutoProcessor, Qwen2VLForConditionalGeneration

    from mmspec.errors import InvalidInputError

    model = Qwen2VLForConditionalGeneration.from_pretrained(src, dtype=torch.float32)
    processor = AutoProcessor.from_pretrained(src)
    text_cfg, vis_cfg = model.config.text_config, model.config.vision_config
    n_text, n_vis = int(text_cfg.num_hidden_layers), int(vis_cfg.depth)
    text_layers, vision_depth = int(text_layers) or n_text, int(vision_depth) or n_vis
    if text_layers < n_text or vision_depth < n_vis:
        raise InvalidInputError(f"grow only adds layers: {src} has {n_text} text layers and {n_vis} vision blocks "
                                f"(asked for {text_layers} and {vision_depth})")
    config = model.config.to_dict()
    config["text_config"].update(num_hidden_layers=text_layers, layer_types=None)
    config["vision_config"]["depth"] = vision_depth
    grown = Qwen2VLForConditionalGeneration(type(model.config).from_dict(config)).float()
    state = model.state_dict()
    new_state = grown.state_dict()
    text_prefix, vis_prefix = "model.language_model.layers.", "model.visual.blocks."

    groups = ((text_prefix, n_text, ("self_attn.o_proj.", "mlp.down_proj.")),
              (vis_prefix, n_vis, ("attn.proj.", "mlp.fc2.")))

    def source(key: str) -> tuple:
        """``(the key in src this weight copies, whether it is a new layer's residual output, to be zeroed)``."""
        for prefix, n, zeroed in groups:
            if key.startswith(prefix):
                i, rest = key[len(prefix):].split(".", 1)
                if int(i) >= n:
                    return f"{prefix}{n - 1}.{rest}", rest.startswith(zeroed)
        return key, False

    for key in new_state:
        src_key, zero = source(key)
        new_state[key] = torch.zeros_like(state[src_key]) if zero else state[src_key].clone()
    missing = sorted(set(state) - {source(k)[0] for k in new_state})
    if missing:
        raise InvalidInputError(f"grow_target: weights of {src} without a place in the grown model: {missing[:4]}")
    grown.load_state_dict(new_state)
    # The probes read the merger's output and layer 0, whose sizes do not change.
    _write_derived(grown, model, processor, src, out, probes=("reader", "locator"))
    if progress:
        print(f"testbed: grew {src} to {text_layers} text layers ({n_text} before) and {vision_depth} vision blocks "
              f"({n_vis} before) in {out}")
    return out


def _write_derived(new, model, processor, src: str, out: str, probes=None) -> None:
    """Save ``new`` (a model computing what ``model``, loaded from ``src``, computes) to ``out`` as a checkpoint of
    its own: weights, processor, training files, and ``src``'s probes (only the names in ``probes`` when given)."""
    from mmspec.checkpoints import copy_training_files

    new.generation_config = model.generation_config
    os.makedirs(out, exist_ok=True)
    new.save_pretrained(out)
    processor.save_pretrained(out)
    copy_training_files(src, out)
    saved = load_probes(src, missing_ok=True)
    if saved:
        save_probes({k: v for k, v in saved.items() if probes is None or k in probes}, os.path.join(out, "state.pt"))


def remerge_target(src: str, out: str, merge: int = 1, progress: bool = True) -> str:
    """A copy of the target in ``src`` whose vision tokens cover ``merge`` x ``merge`` patches (Qwen2-VL's
    ``spatial_merge_size``; processor and config both changed), vision tower and text model carried over, the
    patch merger's MLP new (its input is ``merge**2`` patch features: another shape), its norm carried.

    Why: at merge 2 one vision token covers 28 x 28 px, two to three characters of a 22-26 px line, and a target
    copying text must both find the token and pick the right characters inside it in the right order; the
    bundled one reads scrambled text (no language prior) at 7-15% teacher-forced accuracy while its pointer is
    right 86-99% of the time. At merge 1 a token covers about one character (four times the image tokens). The
    result must be trained (``train --init OUT``); the patch reader and locator start fresh (use ``--probe-warmup``).

    Example:
        >>> remerge_target("vision/assets/testbed-vlm", "/tmp/merge1", merge=1)  # doctest: +SKIP
    """
    from transformers import AutoProcessor, Qwen2VLForConditionalGeneration

    from mmspec.checkpoints import copy_training_files
    from mmspec.errors import InvalidInputError

    if merge not in (1, 2):
        # Workload images are multiples of 28 px: at merge 4 the processor would resize them to multiples of 56,
        # and the renderer's character positions would no longer match the patch grid.
        raise InvalidInputError(f"merge must be 1 or 2 patches per side, got {merge}")
    model = Qwen2VLForConditionalGeneration.from_pretrained(src, dtype=torch.float32)
    processor = AutoProcessor.from_pretrained(src)
    config = model.config.to_dict()
    config["vision_config"]["spatial_merge_size"] = merge
    torch.manual_seed(0)
    new = Qwen2VLForConditionalGeneration(type(model.config).from_dict(config)).float()
    state, new_state = model.state_dict(), new.state_dict()
    for key in new_state:
        if ".merger.mlp." not in key:
            new_state[key] = state[key].clone()
    new.load_state_dict(new_state)
    new.generation_config = model.generation_config
    for part in (processor.image_processor, getattr(processor, "video_processor", None)):
        if part is not None and hasattr(part, "merge_size"):
            part.merge_size = merge
    os.makedirs(out, exist_ok=True)
    new.save_pretrained(out)
    processor.save_pretrained(out)
    copy_training_files(src, out)
    # No state.pt: the patch reader and the locator name cells of the old merge (and read a merger that is new).
    if progress:
        print(f"testbed: {src} remerged to {merge} x {merge} patches per vision token in {out}")
    return out


def ungroup_kv_target(src: str, out: str, progress: bool = True) -> str:
    """A copy of the target in ``src`` with one key-value head per query head: the same function (each shared
    key-value head is repeated for the query heads that read it), free to specialise when trained further.

    Why: the small target's six query heads share two key-value heads of 64 dimensions; its reading heads point at
    the right vision token but what they pass on names the token's characters at 14% (issue 14's relay test).
    Training state (readers, locator, speller, relay; not the optimizer) is carried in ``state.pt``.

    Example:
        >>> ungroup_kv_target("vision/assets/testbed-vlm", "/tmp/kv6")  # doctest: +SKIP
    """
    from transformers import AutoProcessor, Qwen2VLForConditionalGeneration

    model = Qwen2VLForConditionalGeneration.from_pretrained(src, dtype=torch.float32)
    processor = AutoProcessor.from_pretrained(src)
    tc = model.config.text_config
    heads, kv = tc.num_attention_heads, tc.num_key_value_heads
    rep = heads // kv
    config = model.config.to_dict()
    config["text_config"]["num_key_value_heads"] = heads
    new = Qwen2VLForConditionalGeneration(type(model.config).from_dict(config)).float()
    state, new_state = model.state_dict(), new.state_dict()
    for key in new_state:
        value = state[key]
        if key.endswith(("k_proj.weight", "v_proj.weight", "k_proj.bias", "v_proj.bias")) and rep > 1:
            # Query head h reads key-value head h // rep (transformers' repeat_kv): repeat each head's rows.
            value = value.view(kv, -1, *value.shape[1:]).repeat_interleave(rep, dim=0).reshape(new_state[key].shape)
        new_state[key] = value.clone()
    new.load_state_dict(new_state)
    _write_derived(new, model, processor, src, out)
    if progress:
        print(f"testbed: {src} with {heads} key-value heads (was {kv}) in {out}")
    return out


def main(argv=None) -> int:
    """``python -m mmspec.vision.testbed_train train|grow|remerge|ungroup-kv|export ...``: train the testbed target,
    convert a checkpoint, or write its shippable copy (evaluate it with ``python -m mmspec.vision.testbed eval``).

    Example:
        >>> main(["train", "--out", "/tmp/tb", "--size", "tiny", "--steps", "2"])          # doctest: +SKIP
        0
    """
    import argparse

    p = argparse.ArgumentParser(prog="python -m mmspec.vision.testbed_train")
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    add_config_arguments(t, TargetTrainConfig)
    t.add_argument("--vision-only", action="store_true",
                   help="train the vision tower on the patch reader's loss alone (see TargetTrainConfig)")
    g = sub.add_parser("grow", help="a deeper copy of a target that computes the same function (see grow_target)")
    g.add_argument("--init", required=True, help="the target to grow")
    g.add_argument("--out", required=True)
    g.add_argument("--text-layers", type=int, default=0, help="decoder layers in all (0: unchanged)")
    g.add_argument("--vision-depth", type=int, default=0, help="vision blocks in all (0: unchanged)")
    r = sub.add_parser("remerge", help="a copy whose vision tokens cover MERGE x MERGE patches (see remerge_target)")
    r.add_argument("--init", required=True, help="the target to convert")
    r.add_argument("--out", required=True)
    r.add_argument("--merge", type=int, default=1, help="patches per side of a vision token (Qwen2-VL's default: 2)")
    u = sub.add_parser("ungroup-kv", help="a copy with one key-value head per query head (see ungroup_kv_target)")
    u.add_argument("--init", required=True, help="the target to convert")
    u.add_argument("--out", required=True)
    x = sub.add_parser("export")
    x.add_argument("--model", required=True)
    x.add_argument("--out", default=TARGET_DIR)
    args = p.parse_args(argv)
    if args.cmd == "train":
        cfg = TargetTrainConfig(**{k: v for k, v in vars(args).items() if k != "cmd"})
        train_target(cfg)
        return 0
    if args.cmd == "grow":
        print(grow_target(args.init, args.out, args.text_layers, args.vision_depth))
        return 0
    if args.cmd == "remerge":
        print(remerge_target(args.init, args.out, args.merge))
        return 0
    if args.cmd == "ungroup-kv":
        print(ungroup_kv_target(args.init, args.out))
        return 0
    print(export_target(args.model, args.out))  # export
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
