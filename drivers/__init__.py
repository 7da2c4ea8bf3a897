"""mmspec.drivers: the driving world and workload (FlashDrive's streaming KV reuse, reasoning drafter and
trajectory head come with the driving issues).

Importing this package registers the ``driving`` workload (:mod:`mmspec.drivers.workload`); the core
imports it only lazily, through :mod:`mmspec.registry`.

Example:
    >>> from mmspec.drivers.world import make_scenario, simulate
    >>> simulate(make_scenario(0, "cruise"), seconds=0.2).ticks
    3
"""

from mmspec.workloads import register_workload

from .workload import DrivingWorkload

register_workload(DrivingWorkload)

__all__ = ["DrivingWorkload"]
