"""FastMTP for mmspec: one MTP block shared recursively across K draft steps (no modality of its own).

Importing this package (``mmspec.drafters`` does) registers the ``fastmtp`` drafter kind
(``make_drafter("fastmtp:DIR", target)``, ``mmspec bench --systems fastmtp:DIR``, ``drafter="auto"``) and its
trainer (``mmspec train --kind fastmtp``) side by side.

Example:
    >>> from mmspec.registry import drafter_kinds
    >>> from mmspec.train import trainer_kinds
    >>> "fastmtp" in drafter_kinds() and "fastmtp" in trainer_kinds()
    True
"""

from mmspec.registry import register_drafter
from mmspec.train import register_trainer

from .drafter import FastMTPDrafter, fastmtp_factory
from .train import FastMTPLoss, FastMTPTrainer, step_weights

register_drafter("fastmtp", fastmtp_factory)
register_trainer("fastmtp", FastMTPTrainer)

__all__ = ["FastMTPDrafter", "FastMTPLoss", "FastMTPTrainer", "fastmtp_factory", "step_weights"]
