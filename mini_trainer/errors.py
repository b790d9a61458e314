"""The one exception type that the CLI turns into a clear message and a non-zero exit."""


class UserError(Exception):
    """A problem with the user's input, reported as one line per problem on stderr.

    `lines` holds the messages (for example `FILE:LINE: FIELD: reason`); the CLI prints them and
    exits with `exit_code`, without a traceback.
    """

    def __init__(self, *lines: str, exit_code: int = 2):
        super().__init__("\n".join(lines))
        self.lines = list(lines)
        self.exit_code = exit_code
