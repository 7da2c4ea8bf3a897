"""mmspec.drivers: the driving world, its workload, the driving VLA's pipeline with FlashDrive's streaming reuse,
step caching and system level (:mod:`mmspec.drivers.flashdrive`; the reasoning drafter comes later), and
``mmspec drive-sim`` (:func:`mmspec.drivers.bench.drive_sim`).

Importing this package registers the ``driving`` workload (:mod:`mmspec.drivers.workload`'s items, measured by
:class:`~mmspec.drivers.bench.DrivingBenchWorkload`) and
:class:`DrivingPipeline` for the ``driving`` task (so ``MMSpecPipeline.from_pretrained`` returns one for a
folder whose config says ``"mmspec_task": "driving"``); the core imports it only lazily, through
:mod:`mmspec.registry`.

Example:
    >>> from mmspec.drivers.world import make_scenario, simulate
    >>> simulate(make_scenario(0, "cruise"), seconds=0.2).ticks
    3
    >>> from mmspec.drivers import DrivingPipeline
    >>> DrivingPipeline.task
    'driving'
"""

from mmspec.registry import register_command, register_pipeline
from mmspec.workloads import register_workload

from .bench import DrivingBenchWorkload, _sim_arguments, _sim_run
from .pipeline import DrivingPipeline
from .workload import DrivingWorkload

register_workload(DrivingBenchWorkload)  # DrivingWorkload's items with mmspec bench's hooks (drivers/bench.py)
register_pipeline(DrivingPipeline.task, DrivingPipeline, model_types=DrivingPipeline.model_types)
register_command("drive-sim", "the driving-simulation latency loop: open-loop clip replay and closed loop at 10 Hz, "
                 "plain vs FlashDrive", _sim_arguments, _sim_run)

__all__ = ["DrivingWorkload", "DrivingPipeline"]
