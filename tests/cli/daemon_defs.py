"""A Dagster code location for the `run --hold` daemon test: one job, scheduled every minute."""

import dagster as dg


@dg.op
def tick(context: dg.OpExecutionContext) -> None:
    context.log.info("tick")


@dg.job
def every_minute_job() -> None:
    tick()


every_minute = dg.ScheduleDefinition(job=every_minute_job, cron_schedule="* * * * *",
                                     default_status=dg.DefaultScheduleStatus.RUNNING)

defs = dg.Definitions(jobs=[every_minute_job], schedules=[every_minute])
