"""Spatial 2-D drafting (the SSD seed, Spatially Speculative Decoding): the ``spatial`` drafter.

Each round the drafter asks :class:`~mmspec.image_ar.spatial.GridScheduler` which slots follow the committed codes
in raster order and can be reached from committed context: the rest of the current row and the next row(s) up to
the first cell with nothing committed above it (``k_v`` rows of reach), newline slots forced. The trained
:class:`~mmspec.image_ar.ssd_head.SpatialHead` predicts all of them *in parallel* in one call, each from the target's
hidden states of the last committed code and of the committed cell straight above (masked when there is none), and
the chain goes to the target.

Options (run time, ``spatial;draft=argmax;jacobi=true``): ``draft`` ``"sample"`` draws each slot from the head's
distribution (``draft_temperature``) and hands it to the rule as ``q``; ``"argmax"`` proposes the head's most likely
code (a deterministic draft: accepted with probability ``p(x)``), which on the bundled generator accepts more. With
``jacobi=true`` the slots the last verify pass already scored past its first rejection (on a prefix that held the
rejected draft) are drafted from the target's own distributions there, as SJD carries them, and the head fills the
rest of the plan; both are drafts like any other, so the modes below keep their guarantees. The bundled head
(``image_ar/assets/spatial-head``) ships with ``draft_len=20, draft=argmax, jacobi=true``.

Two modes:

* **lossless** (default): the chain is verified by the core's standard rule (greedy equality; speculative sampling
  with the head's distribution as ``q``), so the codes are the target's own, token for token under greedy and in
  law under sampling, with or without classifier-free guidance, at any batch size.
* **verify-and-correct** (``rounds=r``, lossy, the paper's mode): a block goes through ``r`` verify-and-correct
  passes, then one pass commits what is left of it whole (the paper's count: ``r`` rounds, then the committing
  pass; ``rounds=0`` commits the head's draft unverified). In a verify-and-correct pass the chain is walked by the
  core's lossless rule; past the first rejected draft every later position is tested *on its own* against the
  target's distribution of the same (now stale) pass, with the core rule's ``accept_prob`` / ``residual`` hooks,
  and replaced by a residual draw when rejected (greedy: by the target's argmax) instead of being dropped
  (:meth:`SpatialCorrectRule.correct`); the corrected positions are the next pass's chain. Those positions were
  drawn from distributions conditioned on a prefix that was not kept, so the output is not the target's law: the
  rule that commits (:class:`SpatialCorrectRule`, ``ssd_correct``) declares itself lossy and every stats record says
  so. With ``rounds >= draft_len - 1`` nothing is left to commit unverified (each pass consumes at least one
  position), and the output is the target's own. With ``rule=None``
  :func:`~mmspec.image_ar.generator.speculative_codes` uses the lossy rule for a drafter with ``rounds`` set (an
  instance or a spec string). :func:`mmspec.generate` does not consult the drafter for a rule: pass
  ``rule=drafter.make_rule(do_sample)`` there; a lossy drafter whose trees another rule walks refuses to go on
  (:class:`~mmspec.InvalidInputError`) after the first round.

  Where the quality goes (bundled generator, greedy, 16 prompts): the carried positions are right (``rounds=20``
  gives AR's codes token for token), but a block committed whole holds the target's choices on a stale prefix:
  29% / 20% / 12% of the codes at ``rounds=0`` / ``1`` / ``2`` differ from the target's argmax on the prefix they
  were committed after (0% for AR), and prompt accuracy falls from 0.81 to 0.06 / 0.12 / 0.31. The generator,
  trained teacher-forced, is not robust to such codes: a property of the method on this target, not a bookkeeping
  error.

``ssd_correct`` is built for one mode: ``"ssd_correct"`` for sampling, ``"ssd_correct;greedy=true"`` for greedy
runs (``speculative_codes`` picks the run's mode when the name has no ``greedy`` option). It refuses a spatial tree
drafted in the other mode; with any other drafter the core labels such a run lossy.

Example:
    >>> from mmspec.image_ar.spatial import RasterMap
    >>> d = SpatialDrafter(hidden_size=8, n_codes=4, height=3, width=4, k_h=2, k_v=1)
    >>> d.kind, d.lossy, [s.seq for s in d.scheduler.plan(5)]
    ('spatial', False, [5, 6, 7, 8])
"""

from __future__ import annotations

import numpy as np
import torch

from mmspec.acceptance import AcceptanceRule, AcceptResult, GreedyRule, SpeculativeSamplingRule
from mmspec.drafters.base import DraftContext, RoundResult
from mmspec.drafters.saving import TrainableDrafter, target_fingerprint
from mmspec.errors import DrafterMismatchError, InvalidInputError
from mmspec.tree import DraftTree

from .spatial import GridScheduler, RasterMap
from .ssd_head import SpatialHead, slot_inputs

__all__ = ["SpatialDrafter", "SpatialCorrectRule"]


def _int_opt(name: str, v, low: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise InvalidInputError(f"spatial {name} must be an integer >= {low} (got {v!r})")
    return v


class SpatialDrafter(TrainableDrafter):
    """The spatial drafter (module docstring). Build one for a target with :meth:`from_target`; train it with
    ``mmspec train --kind spatial --workload images``.

    Args:
        hidden_size: the target's hidden size; n_codes: its image codes (token ``offset + c`` is code ``c``).
        height, width: the code grid; newline / newline_token: rows end in a forced newline token (Lumina-mGPT).
        k_h: horizontal reach along the current row; k_v: vertical reach (rows below a committed cell).
        draft_len: at most this many slots a round.
        rounds: ``None`` for the lossless mode; ``r >= 0`` for verify-and-correct: ``r`` passes, then the block is
            committed whole (lossy).
        draft: ``"sample"`` (from the head, ``q`` given to the rule) or ``"argmax"`` (deterministic drafts).
        draft_temperature: the head's temperature for sampled drafts.
        jacobi: draft the slots the last pass scored past its first rejection from the target's distributions there.
        num_layers, intermediate_size, max_delta, rms_eps: the head's shape (:class:`SpatialHead`).
        layer_id: the target ``hidden_states`` index the head reads (its last layer).
    """

    kind = "spatial"

    def __init__(self, hidden_size: int, n_codes: int, height: int, width: int, newline: bool = False,
                 newline_token: int | None = None, k_h: int = 5, k_v: int = 1, draft_len: int = 16,
                 rounds: int | None = None, num_layers: int = 2, intermediate_size: int | None = None,
                 max_delta: int = 64, rms_eps: float = 1e-6, layer_id: int = -1, draft: str = "sample",
                 draft_temperature: float = 1.0, jacobi: bool = False, fingerprint: dict | None = None):
        super().__init__(fingerprint=fingerprint)
        if draft not in ("sample", "argmax"):
            raise InvalidInputError(f"spatial draft must be 'sample' or 'argmax' (got {draft!r})")
        if isinstance(draft_temperature, bool) or not isinstance(draft_temperature, (int, float)) \
                or not draft_temperature > 0:
            raise InvalidInputError(f"spatial draft_temperature must be a number > 0 (got {draft_temperature!r})")
        self.draft, self.draft_temperature, self.jacobi = draft, float(draft_temperature), bool(jacobi)
        self.k_h, self.k_v = _int_opt("k_h", k_h), _int_opt("k_v", k_v, 0)
        self.draft_len = _int_opt("draft_len", draft_len)
        self.rounds = None if rounds is None else _int_opt("rounds", rounds, 0)
        if newline and newline_token is None:
            raise InvalidInputError("spatial newline=true needs newline_token (the token id that ends a row)")
        self.hidden_size, self.n_codes = int(hidden_size), int(n_codes)
        self.height, self.width, self.newline = int(height), int(width), bool(newline)
        self.newline_token = None if newline_token is None else int(newline_token)
        self.num_layers, self.intermediate_size = int(num_layers), intermediate_size
        self.max_delta, self.rms_eps, self.layer_id = int(max_delta), float(rms_eps), int(layer_id)
        self.raster = RasterMap(self.height, self.width, newline=self.newline)
        self.head = SpatialHead(self.hidden_size, self.n_codes, self.height, self.width, self.max_delta,
                                k_v=max(self.k_v, 1), num_layers=self.num_layers,
                                intermediate_size=intermediate_size, rms_eps=self.rms_eps)
        self.offset, self.vocab = 0, None
        self._plans: dict = {}  # (n_done, k_h, k_v, draft_len) -> (plan, slot_inputs): fixed by the grid
        self._reset_run()

    # ------------------------------------------------------------------ construction / saving
    @property
    def scheduler(self) -> GridScheduler:
        return GridScheduler(self.raster, k_h=self.k_h, k_v=self.k_v, max_slots=self.draft_len)

    @property
    def hidden_layers(self) -> tuple:
        return (self.layer_id,)

    @property
    def lossy(self) -> bool:
        return self.rounds is not None

    def config_dict(self) -> dict:
        return {"hidden_size": self.hidden_size, "n_codes": self.n_codes, "height": self.height, "width": self.width,
                "newline": self.newline, "newline_token": self.newline_token, "k_h": self.k_h, "k_v": self.k_v,
                "draft_len": self.draft_len, "rounds": self.rounds, "num_layers": self.num_layers,
                "intermediate_size": self.intermediate_size, "max_delta": self.max_delta, "rms_eps": self.rms_eps,
                "layer_id": self.layer_id, "draft": self.draft, "draft_temperature": self.draft_temperature,
                "jacobi": self.jacobi}

    @classmethod
    def from_target(cls, target, tokenizer=None, grid=None, seed: int | None = None, **kw) -> "SpatialDrafter":
        """A fresh head for ``target`` (a llama code generator or :class:`~mmspec.image_ar.janus.JanusImageLM`):
        grid from ``generation_config.image_grid`` unless given (an int side, or ``(height, width)``), codes after
        ``generation_config.image_code_offset``; the code embeddings and output rows start from the target's own
        where it has them (a llama generator's input embeddings and LM head).

        Example:
            >>> from transformers import LlamaConfig, LlamaForCausalLM
            >>> t = LlamaForCausalLM(LlamaConfig(vocab_size=20, hidden_size=16, intermediate_size=32,
            ...                      num_hidden_layers=2, num_attention_heads=2))
            >>> t.generation_config.image_code_offset = 4
            >>> d = SpatialDrafter.from_target(t, grid=4)
            >>> d.n_codes, d.hidden_layers, d.fingerprint["layer_ids"]
            (16, (2,), [2])
        """
        gc = target.generation_config
        text = target.config.get_text_config(decoder=True)
        grid = grid if grid is not None else getattr(gc, "image_grid", None)
        if grid is None:
            raise InvalidInputError("the spatial drafter needs the image grid: pass grid=SIDE or set "
                                    "generation_config.image_grid")
        height, width = (grid, grid) if isinstance(grid, int) else tuple(grid)
        offset = int(getattr(gc, "image_code_offset", 0) or 0)
        vocab = int(text.vocab_size)
        layer = int(text.num_hidden_layers)
        kw.setdefault("rms_eps", float(getattr(text, "rms_norm_eps", 1e-6)))
        if seed is not None:
            torch.manual_seed(seed)
        d = cls(hidden_size=int(text.hidden_size), n_codes=vocab - offset, height=height, width=width, layer_id=layer,
                fingerprint=_fingerprint(target, tokenizer, (layer,)), **kw)
        emb, out = target.get_input_embeddings(), target.get_output_embeddings()
        with torch.no_grad():
            if emb is not None and emb.weight.shape[0] == vocab:
                d.head.code_embed.weight[: d.n_codes].copy_(emb.weight[offset:].detach().float())
            if out is not None and out.weight.shape[0] == vocab:
                d.head.out.weight.copy_(out.weight[offset:].detach().float())
        dev = target.device if target.device.type != "meta" else torch.device("cpu")
        return d.to(dev).eval()

    def bind(self, model) -> None:
        if self.fingerprint:
            actual = _fingerprint(model, None, self.fingerprint.get("layer_ids", ()))
            diffs = [f"{k}: trained for {v!r}, got {actual[k]!r}" for k, v in self.fingerprint.items()
                     if k in actual and actual[k] != v]
            if diffs:
                raise DrafterMismatchError(f"this spatial head was trained for another target ({'; '.join(diffs)})")
        gc = getattr(model, "generation_config", None)
        self.offset = int(getattr(gc, "image_code_offset", 0) or 0)
        self.vocab = int(model.config.get_text_config(decoder=True).vocab_size)
        if self.vocab - self.offset != self.n_codes:
            raise DrafterMismatchError(f"this spatial head drafts {self.n_codes} image codes; the target has "
                                       f"{self.vocab - self.offset} after offset {self.offset}")

    def make_rule(self, do_sample: bool) -> AcceptanceRule | None:
        """The rule this drafter's mode needs: ``None`` (the core's lossless rule) or, with ``rounds``, the lossy
        :class:`SpatialCorrectRule`."""
        return SpatialCorrectRule(greedy=not do_sample) if self.lossy else None

    # ------------------------------------------------------------------ run-time state
    def _reset_run(self) -> None:
        self._feats = self._codes = None  # [rows, N, H] / [rows, N]: feat and code index of every committed slot
        # [rows, N + 1, 2H]: the head's state [feat; embed(code)] of every committed slot (feats is its first half),
        # written once per slot; the last entry stays zero: what the head reads where nothing is committed above.
        self._states = None
        self._n: dict = {}  # row -> committed image slots whose feats are stored (feats[r, :n] valid)
        self._n_codes: dict = {}  # row -> committed codes already written to codes[r]
        self._paths: dict = {}  # row -> accepted path of the last pass (ingested at the next propose)
        self._carry: dict = {}  # lossy mode: row -> [(token, q)] corrected drafts awaiting their next pass
        self._passes: dict = {}  # lossy mode: row -> correction passes its carried block has had
        self._stale: dict = {}  # jacobi: row -> {seq index: (token, q)} from the last pass's unaccepted slots
        self._counts = {"drafted": 0, "jacobi": 0, "corrected": 0, "committed_whole": 0}

    def counters(self) -> dict:
        return dict(self._counts)

    def _layer(self, ctx: DraftContext):
        h = ctx.hidden.get(self.layer_id)
        if h is None:
            raise InvalidInputError("the spatial drafter reads the target's hidden states; run it through "
                                    "mmspec.generate (which requests its hidden_layers)")
        return h

    @torch.no_grad()
    def begin(self, ctx: DraftContext) -> None:
        self._reset_run()
        h = self._layer(ctx)
        rows = max(ctx.rows) + 1
        n = len(self.raster)
        dev, dtype = self.head.out.weight.device, self.head.out.weight.dtype
        self._states = torch.zeros(rows, n + 2, 2 * self.hidden_size, dtype=dtype, device=dev)
        self._feats = self._states[:, :, : self.hidden_size]
        self._codes = torch.full((rows, n + 1), self.n_codes, dtype=torch.long, device=dev)
        for i, r in enumerate(ctx.rows):
            self._feats[r, 0] = h[i, -1]  # the last prompt position (left padding): it gave code 0
            self._n[r] = 1
            self._n_codes[r] = 0

    def _ingest(self, ctx: DraftContext) -> None:
        """Store the feats of the slots the last pass committed (root and accepted path) and the new codes."""
        h = self._layer(ctx) if self._paths else None
        for i, r in enumerate(ctx.rows):
            path = self._paths.pop(r, None)
            n = self._n[r]
            if path is not None:
                k = min(len(path) + 1, self._codes.shape[1] - n)
                if path == list(range(len(path))):  # a chain accepted from its start: a slice, no gather
                    src = h[i, :k]
                else:
                    src = h[i, torch.tensor([0] + [1 + p for p in path][: k - 1], device=h.device)]
                self._feats[r, n: n + k] = src.to(self._feats.dtype)
                self._n[r] = n + k
            gen = ctx.sequences[i][ctx.prompt_lengths[i]:]
            old, done = self._n_codes[r], min(len(gen), self._codes.shape[1])
            if done > old:  # committed codes never change: only the new ones are written
                c = np.asarray(gen[old:done], dtype=np.int64) - self.offset  # a few tokens: numpy, not kernels
                c = torch.from_numpy(np.where((c >= 0) & (c < self.n_codes), c, self.n_codes)).to(self._codes.device)
                self._codes[r, old:done] = c
                self._states[r, old:done, self.hidden_size:] = self.head.code_embed(c)
                self._n_codes[r] = done

    def _plan(self, n_done: int) -> tuple:
        """The scheduler's plan after ``n_done`` committed slots and the head's inputs of its code slots
        (:func:`slot_inputs`), computed once per ``n_done`` and run-time setting (they depend on nothing else)."""
        key = (n_done, self.k_h, self.k_v, self.draft_len)
        if key not in self._plans:
            plan = self.scheduler.plan(n_done)
            ins = slot_inputs(plan, n_done, self.raster, self.k_v)
            # Where nothing is committed above, the state table's zero row (its last entry).
            ins["above_row"] = [a if a >= 0 else len(self.raster) + 1 for a in ins["above"]]
            self._plans[key] = (plan, ins)
        return self._plans[key]

    @torch.no_grad()
    def propose(self, ctx: DraftContext) -> list:
        self._ingest(ctx)
        trees: list = [None] * len(ctx.rows)
        plans = {}
        for i, r in enumerate(ctx.rows):
            n_done = len(ctx.sequences[i]) - ctx.prompt_lengths[i]
            room = min(self.draft_len, ctx.remaining[i] - 1)
            carry = self._carry.get(r)
            if carry:
                trees[i] = self._carried_tree(r, carry[:max(room, 0)], ctx.do_sample)
                continue
            if room <= 0 or n_done >= len(self.raster):
                trees[i] = DraftTree.empty()
                continue
            plans[i] = (n_done, room)
        if plans:
            self._draft(ctx, plans, trees)
        return trees

    def _carried_tree(self, r: int, carry: list, do_sample: bool) -> DraftTree:
        tokens = [t for t, _ in carry]
        probs = None
        if do_sample:
            probs = torch.stack([q if q is not None else _one_hot(t, self.vocab) for t, q in carry])
        tree = DraftTree.from_chain(tokens, probs)
        # The rule reads these: after ``rounds`` verify-and-correct passes the block is committed whole.
        tree.ssd_commit_all = self._passes.get(r, 0) >= self.rounds
        tree.ssd_greedy, tree.ssd_correct = not do_sample, True
        return tree

    def _draft(self, ctx: DraftContext, plans: dict, trees: list) -> None:
        """Every planned slot of every row in one head call; newline slots forced; with ``jacobi``, slots the last
        pass already scored (past its first rejection) take the target's own draft from that pass instead."""
        sampled = ctx.do_sample and self.draft == "sample"  # else deterministic drafts (a one-hot q)
        keys = ("slot_row", "last", "above_row", "delta", "dv", "row", "col")
        cols = {k: [] for k in keys}
        row_plans = {}
        for i, (n_done, room) in plans.items():
            r = ctx.rows[i]
            full, ins = self._plan(n_done)
            plan = full[:room]
            row_plans[i] = plan
            stale = self._stale.get(r, {})
            end = plan[-1].seq if plan else -1
            pick = [j for j, seq in enumerate(ins["seq"]) if seq <= end and seq not in stale]
            cols["slot_row"] += [r] * len(pick)
            for k in keys[1:]:
                v = ins[k]
                cols[k] += [v[j] for j in pick]
        dev = self._feats.device
        if cols["slot_row"]:
            slot_row, last, above, delta, dv, row, col = torch.tensor([cols[k] for k in keys], dtype=torch.long,
                                                                      device=dev)
            logits = self.head.from_states(self._states[slot_row, last], self._states[slot_row, above], delta, dv,
                                           row, col)
            if sampled:
                q = torch.softmax(logits / self.draft_temperature, dim=-1)
                g = ctx.generator
                draws = torch.multinomial(q.to(g.device) if g is not None else q, 1,
                                          generator=g).squeeze(-1).tolist()
                full_q = torch.nn.functional.pad(q, (self.offset, 0)).cpu()  # over the target's whole vocabulary
            else:
                draws = logits.argmax(dim=-1).tolist()
        k = 0
        for i, plan in row_plans.items():
            stale = self._stale.pop(ctx.rows[i], {})
            tokens, probs = [], []
            for slot in plan:
                if slot.cell is None:
                    tokens.append(self.newline_token)
                    if sampled:
                        probs.append(_one_hot(self.newline_token, self.vocab))
                elif slot.seq in stale:
                    tok, q_stale = stale[slot.seq]
                    tokens.append(tok)
                    if sampled:
                        probs.append(q_stale if q_stale is not None else _one_hot(tok, self.vocab))
                    self._counts["jacobi"] += 1
                else:
                    tokens.append(self.offset + int(draws[k]))
                    if sampled:
                        probs.append(full_q[k])
                    k += 1
            self._counts["drafted"] += len(tokens)
            tree = DraftTree.from_chain(tokens, torch.stack(probs) if sampled and tokens else None)
            # ssd_greedy lets SpatialCorrectRule refuse a run of the other mode (its walk would be the wrong one);
            # ssd_correct asks it to correct the nodes past the bonus; rounds=0 commits the head's draft whole.
            tree.ssd_commit_all, tree.ssd_greedy = self.rounds == 0, not ctx.do_sample
            tree.ssd_correct = self.lossy
            trees[i] = tree

    def _keep_stale(self, ctx: DraftContext, i: int, r: int, tree: DraftTree, a: int, scores) -> None:
        """``jacobi``: the target's distributions at the chain's slots past the bonus token (computed on a prefix
        with a rejected draft in it) give next round's drafts there, as SJD carries them: a draw with that
        distribution as ``q`` when drafts are sampled, else its argmax."""
        m = len(tree)
        if not self.jacobi or scores is None or a >= m:
            return
        base = len(ctx.sequences[i]) - ctx.prompt_lengths[i]  # the seq index of node 0
        s = scores[a + 1: m + 1].float()
        if ctx.do_sample and self.draft == "sample":
            q = torch.softmax(s, dim=-1)
            g = ctx.generator
            toks = torch.multinomial(q.to(g.device) if g is not None else q, 1, generator=g).squeeze(-1).tolist()
            self._stale[r] = {base + a + 1 + j: (int(t), q[j].cpu()) for j, t in enumerate(toks)}
        else:
            self._stale[r] = {base + a + 1 + j: (int(t), None) for j, t in enumerate(s.argmax(dim=-1).tolist())}

    @torch.no_grad()
    def observe(self, ctx: DraftContext, result: RoundResult) -> None:
        for i, r in enumerate(ctx.rows):
            if result.finished[i]:
                self._carry.pop(r, None)
                continue
            tree, path = result.trees[i], result.paths[i]
            self._paths[r] = list(path)
            if not self.lossy:
                self._keep_stale(ctx, i, r, tree, len(path), None if result.scores is None else result.scores[i])
                continue
            if len(tree) and not getattr(tree, "ssd_ruled", False):
                # Another rule walked it: the corrected blocks would only be drafts and the run silently lossless.
                raise InvalidInputError("the spatial drafter with rounds set needs its lossy rule: pass "
                                        "rule=drafter.make_rule(do_sample) (ssd_correct) to mmspec.generate")
            corrected = getattr(tree, "ssd_corrected", None)  # the rule's correction of the nodes past the bonus
            if getattr(tree, "ssd_commit_all", False) or not corrected:
                if getattr(tree, "ssd_commit_all", False) and len(tree):
                    self._counts["committed_whole"] += len(tree)
                self._carry.pop(r, None)
                self._passes.pop(r, None)
                continue
            drafted = tree.tokens[len(tree) - len(corrected):]
            self._counts["corrected"] += sum(int(y != int(x)) for (y, _), x in zip(corrected, drafted))
            self._carry[r] = corrected
            self._passes[r] = self._passes.get(r, 0) + 1

    def forget(self) -> None:
        self._reset_run()


def _one_hot(token: int, vocab: int) -> torch.Tensor:
    q = torch.zeros(vocab)
    q[token] = 1.0
    return q


class SpatialCorrectRule(AcceptanceRule):
    """SSD's verify-and-correct rule (lossy). A spatial tree is first walked by the core's lossless rule of the mode
    (``greedy``: :class:`~mmspec.acceptance.GreedyRule`, else :class:`~mmspec.acceptance.SpeculativeSamplingRule`);
    a tree the lossy drafter marks ``ssd_correct`` then has every node past the bonus position tested *on its own*
    by :meth:`correct` against the same pass's distribution there, and the drafter carries the corrected nodes to its
    next pass. A tree marked ``ssd_commit_all`` is kept whole, the next token drawn from the target after it
    (greedy: its argmax).

    The rule is built for one mode (``mode``: ``"greedy"`` with ``greedy=True``, else ``"sample"``): a spatial tree
    drafted in the other mode is refused (:class:`~mmspec.InvalidInputError`), since the walk would be the wrong
    one (sampling over a greedy run's raw logits).

    Example:
        >>> t = DraftTree.from_chain([1, 2]); t.ssd_commit_all = True
        >>> SpatialCorrectRule(greedy=True).accept(t, torch.tensor([[9., 0, 0], [9., 0, 0], [0, 0, 9.]]))
        AcceptResult(path=[0, 1], next_token=2)
        >>> t = DraftTree.from_chain([1, 2, 2]); t.ssd_correct = True  # node 0 rejected: the bonus takes its place
        >>> SpatialCorrectRule(greedy=True).accept(t, torch.tensor([[9., 0, 0], [0, 9., 0], [9., 0, 0], [0., 0, 0]]))
        AcceptResult(path=[], next_token=0)
        >>> t.ssd_corrected  # nodes 1 and 2 on their own: 2 -> the argmax 1 there, 2 -> 0
        [(1, None), (0, None)]
    """

    name = "ssd_correct"
    lossless = False

    def __init__(self, greedy: bool = False):
        if not isinstance(greedy, bool):
            raise InvalidInputError(f"ssd_correct greedy must be true or false (got {greedy!r})")
        self.greedy = greedy
        self.mode = "greedy" if greedy else "sample"  # the core labels a run of the other mode lossy
        self._walk = GreedyRule() if self.greedy else SpeculativeSamplingRule()

    def accept(self, tree, scores, generator=None):
        marked = getattr(tree, "ssd_greedy", None)
        if marked is not None and marked != self.greedy:
            raise InvalidInputError(f"acceptance rule ssd_correct was built for {self.mode} runs but this run "
                                    f"{'is greedy' if marked else 'samples'}: use 'ssd_correct;greedy="
                                    f"{'true' if marked else 'false'}' or drafter.make_rule(do_sample)")
        tree.ssd_ruled = True  # the spatial drafter's lossy mode checks that this rule, not another, walked its trees
        if not getattr(tree, "ssd_commit_all", False) or not len(tree):
            res = self._walk.accept(tree, scores, generator)
            if getattr(tree, "ssd_correct", False):
                tree.ssd_corrected = self.correct(tree, scores, len(res.path) + 1, generator)
            return res
        last = scores[len(tree)].float()
        if self.greedy:
            nxt = int(last.argmax())
        else:
            p = torch.softmax(last.to(generator.device) if generator is not None else last, dim=-1)
            nxt = int(torch.multinomial(p, 1, generator=generator))
        return AcceptResult(list(range(len(tree))), nxt)

    def correct(self, tree: DraftTree, scores: torch.Tensor, start: int, generator=None) -> list:
        """SSD's per-position correction of chain nodes ``start..`` under one pass's ``scores`` (``scores[j]`` is the
        target's distribution at node ``j``, on a prefix holding the drafts before it). Sampling: node ``j``'s draft
        ``x`` (from ``q_j``, one-hot for a deterministic draft) is kept with the core rule's
        :meth:`~mmspec.acceptance.SpeculativeSamplingRule.accept_prob`, else replaced by a draw from its normalised
        :meth:`~mmspec.acceptance.SpeculativeSamplingRule.residual` (``p_j`` itself if that is empty), so the new
        token is distributed as ``p_j``; greedy: ``argmax p_j``. Returns ``[(token, q)]``, ``q = p_j`` (the law the
        token was drawn from, for the next pass's test; ``None`` under greedy).

        Example:
            >>> t = DraftTree.from_chain([0, 1])
            >>> SpatialCorrectRule(greedy=True).correct(t, torch.tensor([[0., 9.], [9., 0.], [0., 0.]]), 0)
            [(1, None), (0, None)]
        """
        if generator is not None and generator.device != scores.device:
            scores = scores.to(generator.device)  # draws come from the caller's generator
        out = []
        for j in range(start, len(tree)):
            if self.greedy:
                out.append((int(scores[j].argmax()), None))
                continue
            x = int(tree.tokens[j])
            p = torch.softmax(scores[j].float(), dim=-1)
            q = None if tree.draft_probs is None else tree.draft_probs[j].to(p.device, torch.float32)
            if q is None or q[x] <= 0:  # a deterministic draft (or one its q could not have made): one-hot
                q = torch.zeros_like(p)
                q[x] = 1.0
            u = float(torch.rand((), generator=generator, device=p.device))
            if u < self._walk.accept_prob(p, q, x):
                y = x
            else:
                res = self._walk.residual(p, q, x)
                y = int(torch.multinomial(res if res.sum() > 0 else p, 1, generator=generator))
            out.append((y, p.cpu()))
        return out


def _spatial_factory(target_model, path=None, tokenizer=None, untrained=False, **options):
    """``"spatial:DIR"`` loads a trained head (checked against the target); ``"spatial"`` alone the head bundled for
    the target; ``"spatial;untrained=true"`` a random one (tests), built with every option given (``k_v`` sizes its
    head's reach). Run-time options (``draft_len``, ``k_h``, ``k_v``, ``rounds``) override a saved head's (``k_v`` up to
    the reach it was trained for); ``rounds=null`` is the lossless mode."""
    run = {k: options.pop(k) for k in _RUN_OPTIONS if k in options}
    seed = options.pop("seed", None)
    if not path and not untrained:
        path = bundled_spatial_head(target_model)
        if path is None:
            raise InvalidInputError("'spatial' names no trained head for this target: pass 'spatial:DIR' (a head "
                                    "trained with `mmspec train --kind spatial --workload images`), or "
                                    "'spatial;untrained=true' for a random head (tests only)")
    if path:
        if options:
            raise InvalidInputError(f"unknown options for a saved spatial drafter: {sorted(options)}")
        device = target_model.device if target_model is not None and target_model.device.type != "meta" else None
        # The fingerprint is checked by bind (make_drafter binds), which also reads Janus's image mode.
        drafter = SpatialDrafter.from_pretrained(path, device=device)
    else:
        if target_model is None:
            raise InvalidInputError("'spatial;untrained=true' builds a head for a target: none was given")
        _check_run_options(run)
        try:  # a fresh head takes the run options as its shape (k_v sizes its vertical-offset table)
            return SpatialDrafter.from_target(target_model, tokenizer, seed=seed, **options, **run)
        except TypeError as e:
            raise InvalidInputError(f"bad spatial drafter options {sorted(options)}: {e}") from e
    _check_run_options(run)
    reach = drafter.head.dv_embed.num_embeddings - 1
    if run.get("k_v", 0) > reach:
        raise InvalidInputError(f"this spatial head was trained for k_v <= {reach} (got k_v={run['k_v']})")
    for k, v in run.items():
        setattr(drafter, k, v)
    return drafter


_RUN_OPTIONS = ("draft_len", "k_h", "k_v", "rounds", "draft", "draft_temperature", "jacobi")
# What only an untrained head (built by from_target) also takes.
_SHAPE_OPTIONS = ("grid", "newline", "newline_token", "num_layers", "intermediate_size", "max_delta", "rms_eps")


def _check_run_options(run: dict) -> None:
    for k, v in run.items():
        if k == "rounds" and v is None:
            continue
        if k == "draft":
            if v not in ("sample", "argmax"):
                raise InvalidInputError(f"spatial draft must be 'sample' or 'argmax' (got {v!r})")
        elif k == "jacobi":
            if not isinstance(v, bool):
                raise InvalidInputError(f"spatial jacobi must be true or false (got {v!r})")
        elif k == "draft_temperature":
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise InvalidInputError(f"spatial draft_temperature must be a number > 0 (got {v!r})")
        else:
            _int_opt(k, v, 0 if k in ("k_v", "rounds") else 1)


def bundled_spatial_head(target_model) -> str | None:
    """The head shipped under ``image_ar/assets/spatial-head*`` for ``target_model``: its fingerprint matches, and
    so does its grid where the target names one (``generation_config.image_grid``; the 16 x 16 and 32 x 32
    generators share a shape and a tokenizer, not a grid). ``None`` when none matches, or when the target names no
    grid and heads of several grids match.

    Example:
        >>> bundled_spatial_head(None) is None
        True
    """
    import glob
    import json
    import os

    if target_model is None:
        return None
    grid = getattr(getattr(target_model, "generation_config", None), "image_grid", None)
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets")
    found = []
    for path in sorted(glob.glob(os.path.join(root, "spatial-head*"))):
        if not os.path.isfile(os.path.join(path, "config.json")):
            continue
        with open(os.path.join(path, "config.json")) as f:
            saved = json.load(f)
        fp = saved.get("target_fingerprint", {})
        if grid and saved.get("config", {}).get("height") not in (None, int(grid)):
            continue
        actual = _fingerprint(target_model, None, fp.get("layer_ids", ()))
        if all(actual.get(k, v) == v for k, v in fp.items()):
            found.append(path)
    # Several heads fit (a target that names no grid, or a head that names none): none is chosen. A head of the
    # wrong grid drafts from the wrong neighbours (lossless still, but slow), and no folder order says which is meant.
    return found[0] if len(found) == 1 else None


def _fingerprint(target, tokenizer, layer_ids) -> dict:
    """:func:`~mmspec.drafters.saving.target_fingerprint`, also for a target without an output embedding (Janus's
    image mode: its codes leave through a generation head), whose vocabulary is then its config's."""
    if target.get_output_embeddings() is not None:
        return target_fingerprint(target, tokenizer, layer_ids)
    text = target.config.get_text_config(decoder=True)
    return {"model_type": target.config.model_type, "hidden_size": int(text.hidden_size),
            "vocab_size": int(text.vocab_size), "num_hidden_layers": int(text.num_hidden_layers),
            "layer_ids": [int(i) for i in layer_ids]}


def check_spec(spec: str) -> None:
    """Check a ``spatial[:DIR];key=value`` spec's run options without loading anything (bench systems are checked
    before the model loads); raises :class:`~mmspec.InvalidInputError`.

    Example:
        >>> check_spec("spatial;draft_len=0")
        Traceback (most recent call last):
        ...
        mmspec.errors.InvalidInputError: spatial draft_len must be an integer >= 1 (got 0)
    """
    from mmspec.registry import _spec_options

    options = _spec_options(spec, spec.split(";")[1:])
    shape = _SHAPE_OPTIONS if options.get("untrained") is True else ()  # a fresh head takes its shape from the spec
    unknown = sorted(set(options) - set(_RUN_OPTIONS) - set(shape) - {"untrained", "seed"})
    if unknown:
        raise InvalidInputError(f"unknown spatial options {unknown}; run options: {', '.join(_RUN_OPTIONS)}")
    _check_run_options({k: v for k, v in options.items() if k in _RUN_OPTIONS})
