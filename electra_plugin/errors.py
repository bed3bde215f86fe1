"""The one error type the plugin raises for bad user input."""


class ElectraUsageError(SystemExit):
    """A problem with the user's data, options or files, reported as one line.

    It derives from SystemExit on purpose: ``fairseq-train`` and ``fairseq-hydra-train``
    then print just the message and exit with status 1 instead of a traceback from deep
    inside fairseq (the trainer re-wraps every ``Exception`` raised while loading a
    checkpoint, hydra reformats them). Catch it as ``ElectraUsageError`` in Python code.
    """

    def __init__(self, message: str):
        message = " ".join(str(message).split())  # one line, whatever was quoted into it
        super().__init__(f"electra_plugin: error: {message}")
        self.message = message

    def __str__(self):
        return self.code
