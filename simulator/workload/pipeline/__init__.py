"""Pipeline parallelism: schedules as data (:mod:`.schedules`) and their emission (:mod:`.emit`)."""

from simulator.workload.pipeline.schedules import SCHEDULES, Action, pipeline_schedule

__all__ = ["SCHEDULES", "Action", "pipeline_schedule"]
