"""What GLANCE's head reads of the page: which prompt positions are image tokens, and the shuffled-features
ablation that proves the head reads them.

The block body itself is modality-free (:mod:`mmspec.drafters.block`); what is GLANCE's own is that the
context it attends to covers the image positions, with the target's M-RoPE positions (time, height, width),
so "where on the page am I" is something the head can compute. The issue asks for proof that it reads: run
the same head with the image-position states of ANOTHER item of the same workload swapped in
(``glance;image_features=shuffled``). Zeroed states would be out of distribution and would make any head
collapse; another page's states are in distribution and only lack this page's content.

Example:
    >>> import torch
    >>> bank = ShuffledImageFeatures()
    >>> a, b = torch.ones(4, 2), torch.full((4, 2), 2.0)
    >>> bank.swap([a, b], [torch.tensor([0, 1, 1, 0]).bool()] * 2)[0][1:3].tolist()  # row 0 gets row 1's
    [[2.0, 2.0], [2.0, 2.0]]
"""

from __future__ import annotations

import torch

__all__ = ["image_token_ids", "image_token_mask", "ShuffledImageFeatures", "nearest_tokens", "context_tokens", "token_pairs"]


def image_token_ids(config) -> list:
    """The image and video placeholder ids a target's ``config`` names (``image_token_id``, ``video_token_id``,
    ``image_token_index``; a text target has none).

    Example:
        >>> from types import SimpleNamespace
        >>> image_token_ids(SimpleNamespace(image_token_id=9, video_token_id=None))
        [9]
    """
    special = [getattr(config, k, None) for k in ("image_token_id", "video_token_id", "image_token_index")]
    return [int(s) for s in special if s is not None]


def image_token_mask(model, model_inputs: dict, row: int) -> torch.Tensor:
    """``bool[plen]``: which of original row ``row``'s unpadded prompt tokens are image or video placeholders
    (the ``image_token_id`` / ``video_token_id`` of the target's config; a text target has none).

    Example:
        >>> from types import SimpleNamespace
        >>> m = SimpleNamespace(config=SimpleNamespace(image_token_id=9))
        >>> ids = torch.tensor([[0, 5, 9, 9, 6]]); mask = torch.tensor([[0, 1, 1, 1, 1]])
        >>> image_token_mask(m, {"input_ids": ids, "attention_mask": mask}, 0).tolist()
        [False, True, True, False]
    """
    ids = model_inputs["input_ids"][row]
    mask = model_inputs.get("attention_mask")
    if mask is not None:
        ids = ids[mask[row].bool()]
    out = torch.zeros(ids.shape, dtype=torch.bool, device=ids.device)
    for s in image_token_ids(model.config):
        out |= ids == s
    return out


@torch.no_grad()
def nearest_tokens(table: torch.Tensor, vectors: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """Per row of ``vectors[n, H]`` the index of the nearest row of ``table[V, H]`` (squared distance), computed in
    float32 in chunks (a page's few hundred vectors against a 49k vocabulary).

    Example:
        >>> nearest_tokens(torch.eye(3), torch.tensor([[0.1, 0.9, 0.0], [2.0, 0.0, 0.1]])).tolist()
        [1, 0]
    """
    t = table.float()
    sq = (t * t).sum(1)
    out = [(2 * v.float() @ t.T - sq).argmax(-1) for v in vectors.split(chunk)] if len(vectors) else []
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long, device=vectors.device)


def token_pairs(model) -> list:
    """Token pairs whose mean input embedding stands for one image token of ``model``: the reader's "space, digit"
    boxes (its tokenizer writes the space before a number as a token of its own; its front end puts the mean of
    the two embeddings in such a box). None for other targets.

    Example:
        >>> from types import SimpleNamespace
        >>> token_pairs(SimpleNamespace(config=SimpleNamespace(model_type="qwen2_vl")))
        []
    """
    from mmspec.errors import InvalidInputError
    from mmspec.vision.reader.drafter import is_reader, space_and_digits

    if not is_reader(model):
        return []
    try:
        space, digits = space_and_digits(model)
    except InvalidInputError:  # the reader's architecture with another vocabulary: no boxes of two tokens known
        return []
    return [(space, d) for d in digits]


def context_tokens(model, ids: torch.Tensor, embeds: torch.Tensor, pairs=()) -> tuple:
    """The pointer's slots of a prompt: what a pointer head matches and reads, ``(tokens[S], positions[S])``.
    ``ids[plen]`` stay as they are, one slot each, except that an image or video placeholder becomes the token whose
    input embedding is nearest to the vector the target's language model receives there (``embeds[plen, H]``: the
    target's ``hidden_states[0]``), or two slots when that vector is nearest to the mean embedding of one of
    ``pairs`` (:func:`token_pairs`). For the reader, whose front end puts the LM's embedding of the token in each box,
    that is the page read token by token (what page lookup reads); for another VLM the vocabulary's nearest word to
    each patch, a weak but honest signal.

    Example:
        >>> from types import SimpleNamespace
        >>> E = torch.eye(4)
        >>> m = SimpleNamespace(config=SimpleNamespace(image_token_id=3), get_input_embeddings=lambda: SimpleNamespace(weight=E))
        >>> emb = torch.tensor([[0., 1, 0, 0], [0, 0, 1, 0], [0.5, 0.5, 0, 0]])
        >>> [t.tolist() for t in context_tokens(m, torch.tensor([1, 3, 3]), emb, pairs=[(0, 1)])]
        [[1, 2, 0, 1], [0, 1, 2, 2]]
    """
    ids = torch.as_tensor(ids, dtype=torch.long).cpu()
    image = torch.zeros(ids.shape, dtype=torch.bool)
    for s in image_token_ids(model.config):
        image |= ids == s
    if not bool(image.any()):
        return ids.clone(), torch.arange(len(ids))
    table = model.get_input_embeddings().weight
    V = table.shape[0]
    if pairs:
        table = torch.cat([table, torch.stack([(table[a] + table[b]) / 2 for a, b in pairs])])
    read = nearest_tokens(table, embeds[image.to(embeds.device)].to(table.device)).cpu().tolist()
    tokens, positions, k = [], [], 0
    for i, t in enumerate(ids.tolist()):
        if not image[i]:
            got = [t]
        else:
            c = read[k]
            k += 1
            got = [c] if c < V else list(pairs[c - V])
        tokens += got
        positions += [i] * len(got)
    return torch.tensor(tokens, dtype=torch.long), torch.tensor(positions, dtype=torch.long)


class ShuffledImageFeatures:
    """The donor bank of the shuffled-features ablation.

    For each prompt with image positions, :meth:`swap` replaces the states at those positions with the
    image-position states of another item: first another row of the same batch (rows are rotated by one), else
    the most recent earlier request whose image states differ. A donor with another number of image tokens
    is cut or repeated to fit (the testbed's items of one workload share their image size, so this is rare).
    A request with no donor at all (the very first one, batch 1) keeps its own states and is counted in
    ``kept_own``: report that count with any figure measured with the ablation.

    Args:
        memory: how many earlier requests' image states to keep as donors.
    """

    def __init__(self, memory: int = 8):
        self.memory = int(memory)
        self.bank: list = []
        self.swapped = 0
        self.kept_own = 0

    @staticmethod
    def _fit(donor: torch.Tensor, n: int) -> torch.Tensor:
        m = donor.shape[0]
        return donor if m == n else donor[torch.arange(n, device=donor.device) % m]

    def swap(self, features: list, masks: list) -> list:
        """``features[i][plen, D]`` with image positions ``masks[i]`` -> the same with donors' states there."""
        own = [f[m] for f, m in zip(features, masks)]
        with_images = [i for i, m in enumerate(masks) if bool(m.any())]
        out = list(features)
        for j, i in enumerate(with_images):
            donor = None
            for step in range(1, len(with_images)):  # another row of this batch, rotated
                cand = own[with_images[(j + step) % len(with_images)]]
                if not (cand.shape == own[i].shape and torch.equal(cand, own[i])):
                    donor = cand
                    break
            if donor is None:
                donor = next((d for d in reversed(self.bank)
                              if not (d.shape == own[i].shape and torch.equal(d.to(own[i].device), own[i]))), None)
            if donor is None:
                self.kept_own += 1
                continue
            f = features[i].clone()
            f[masks[i]] = self._fit(donor.to(f.device, f.dtype), int(masks[i].sum()))
            out[i] = f
            self.swapped += 1
        for i in with_images:
            self.bank.append(own[i].detach())
        del self.bank[: max(0, len(self.bank) - self.memory)]
        return out
