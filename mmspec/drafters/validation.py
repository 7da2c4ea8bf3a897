"""A saved drafter's validation figures: held-out acceptance and the τ it predicts, kept in its ``config.json``.

Why: choosing among several drafters trained for one target (``drafter="auto"``, :mod:`mmspec.drafters.auto`)
needs a number per drafter that was measured the same way for each, without running them. ``mmspec train
--val-shards N`` already scores the drafter on held-out target data at every checkpoint (``val_log.jsonl``: per
drafted position ``k`` the top-1 agreement ``acc_k`` with the target's own token, teacher-forced); at the end of
``fit`` the last of those records becomes a ``"validation"`` block of the saved drafter's ``config.json``::

    "validation": {"tau": 2.5858, "accept_rate": [0.67848, 0.6465, 0.64875, 0.64717], "records": 128,
                   "source": "val_log step 3000", "estimate": "teacher-forced top-1"}

``tau`` is an **estimate**: ``1 + sum_k prod_{j<=k} acc_j``, the expected tokens committed per target pass of a
greedy chain as deep as the logged positions, if each position were accepted with its logged top-1 rate and
independently of the others. The rates are teacher-forced (each position read the target's true prefix, not the
drafter's own guesses), so the estimate is optimistic where errors compound; it ranks drafters of one target, it
does not replace ``mmspec bench``.

For a drafter saved without it (or a bundled one), write the block from its training run's log::

    python -m mmspec.drafters.validation DRAFTER_DIR [--val-log RUN/val_log.jsonl] [--step N]

Example:
    >>> tau_estimate([0.5, 0.5])
    1.75
    >>> tau_estimate([])
    1.0
"""

from __future__ import annotations

import json
import math
import os

from ..errors import InvalidInputError
from .saving import CONFIG_NAME

__all__ = ["VALIDATION_KEY", "tau_estimate", "validation_from_log", "read_drafter_config", "write_validation",
           "record_validation", "main"]

VALIDATION_KEY = "validation"
"""The ``config.json`` key of a saved drafter's validation block."""

VAL_LOG_NAME = "val_log.jsonl"  # as mmspec.train writes it (the core trainer imports this module, not the reverse)


def tau_estimate(accept_rate) -> float:
    """``1 + sum_k prod_{j<=k} acc_j``: tokens per target pass of a chain whose position ``k`` is accepted with
    probability ``acc_k`` once all before it were (the bonus token counted), as estimated from per-position
    top-1 rates.

    Example:
        >>> round(tau_estimate([0.678, 0.647, 0.649, 0.647]), 3)
        2.586
    """
    tau, run = 1.0, 1.0
    for a in accept_rate:
        a = float(a)
        if not math.isfinite(a) or not 0.0 <= a <= 1.0:
            raise InvalidInputError(f"an acceptance rate must lie in [0, 1] (got {a!r})")
        run *= a
        tau += run
    return tau


def validation_from_log(val_log: str, step: int | None = None) -> dict | None:
    """The validation block of the record of ``step`` in ``val_log`` (the last record when ``step`` is ``None``);
    ``None`` when the log is missing or holds no such record.

    Example:
        >>> validation_from_log("/no/such/val_log.jsonl") is None
        True
    """
    if not os.path.isfile(val_log):
        return None
    rec = None
    with open(val_log) as f:
        for line in f:
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except ValueError:  # a line cut by a crash: not a record
                continue
            if step is None or r.get("step") == step:
                rec = r
    if rec is None or not rec.get("acc"):
        return None
    acc = [round(float(a), 5) for a in rec["acc"]]
    return {"tau": round(tau_estimate(acc), 4), "accept_rate": acc, "records": int(rec.get("records", 0)),
            "source": f"val_log step {rec.get('step')}", "estimate": "teacher-forced top-1"}


def read_drafter_config(path) -> dict | None:
    """A saved drafter's ``config.json`` as a dict; ``None`` when ``path`` holds no drafter (no ``config.json``,
    unreadable JSON, or a config without ``drafter_kind``, e.g. a target model's folder).

    Example:
        >>> read_drafter_config("/no/such/drafter") is None
        True
    """
    cfg_path = os.path.join(os.fspath(path), CONFIG_NAME)
    if not os.path.isfile(cfg_path):
        return None
    try:
        with open(cfg_path) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) and isinstance(config.get("drafter_kind"), str) else None


def write_validation(path, block: dict) -> dict:
    """Set the validation block of the saved drafter at ``path`` (its ``config.json`` rewritten atomically, every
    other key kept); returns the new config.

    Raises:
        InvalidInputError: ``path`` holds no saved drafter, or ``block`` has no finite ``tau``.
    """
    config = read_drafter_config(path)
    if config is None:
        raise InvalidInputError(f"no saved drafter at {path} (a config.json with drafter_kind)")
    tau = block.get("tau") if isinstance(block, dict) else None
    if not isinstance(tau, (int, float)) or not math.isfinite(tau):
        raise InvalidInputError(f"a validation block needs a finite 'tau' (got {block!r})")
    config[VALIDATION_KEY] = dict(block)
    cfg_path = os.path.join(os.fspath(path), CONFIG_NAME)
    tmp = cfg_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    os.replace(tmp, cfg_path)
    return config


def record_validation(out, step: int | None = None, val_log: str | None = None) -> dict | None:
    """What ``mmspec train`` calls at the end of ``fit``: the validation block of ``step`` (default: the log's
    last record) from ``val_log`` (default ``out/val_log.jsonl``) written into the drafter saved at ``out``.
    Returns the block, or ``None`` when there are no held-out records (``--val-shards 0``).

    Example:
        >>> record_validation("/no/such/run") is None
        True
    """
    block = validation_from_log(val_log or os.path.join(os.fspath(out), VAL_LOG_NAME), step)
    if block is None or read_drafter_config(out) is None:
        return None
    write_validation(out, block)
    return block


def main(argv=None) -> int:
    """``python -m mmspec.drafters.validation DRAFTER_DIR [--val-log FILE] [--step N]``: write the block."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m mmspec.drafters.validation",
                                description="Write a saved drafter's validation block (held-out acceptance and the "
                                            "tau it estimates) into its config.json, from a val_log.jsonl.")
    p.add_argument("drafter", help="the saved drafter's folder")
    p.add_argument("--val-log", default=None, help="default: DRAFTER/val_log.jsonl")
    p.add_argument("--step", type=int, default=None, help="the record of this step (default: the last)")
    args = p.parse_args(argv)
    log = args.val_log or os.path.join(args.drafter, VAL_LOG_NAME)
    block = validation_from_log(log, args.step)
    if block is None:
        raise SystemExit(f"no held-out record{'' if args.step is None else f' of step {args.step}'} in {log}")
    write_validation(args.drafter, block)
    print(json.dumps(block))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
