"""mmspec.drivers: the driving world, its workload and the driving VLA's pipeline (FlashDrive's streaming KV
reuse and reasoning drafter come with the driving issues).

Importing this package registers the ``driving`` workload (:mod:`mmspec.drivers.workload`) and
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

from mmspec.registry import register_pipeline
from mmspec.workloads import register_workload

from .pipeline import DrivingPipeline
from .workload import DrivingWorkload

register_workload(DrivingWorkload)
register_pipeline(DrivingPipeline.task, DrivingPipeline, model_types=DrivingPipeline.model_types)

__all__ = ["DrivingWorkload", "DrivingPipeline"]
