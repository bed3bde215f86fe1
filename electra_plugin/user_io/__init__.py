"""What a user sees of a command besides its results: the one error type and its one-line
edge, the logging set-up, progress lines, and the rules for output directories and files
that a failed write leaves as they were."""
