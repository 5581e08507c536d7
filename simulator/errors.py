"""The one exception type for errors a user can cause (bad scenario, block too big, bad shapes).

Its message names the field, the value and the limit; the CLI prints it on one line and exits 2.
"""


class HbmsimError(Exception):
    """A user-caused error; str(err) is a complete one-line explanation."""
