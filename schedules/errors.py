"""The one error type for anything wrong with a schedule, a program or a schedule file."""


class ScheduleError(ValueError):
    """A schedule, program or file breaks a rule; the message names the rule and the place."""
