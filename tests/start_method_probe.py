"""A module with fairseq-train's entry point (``cli_main``) that prints how its process starts
child processes by default (tests/test_trials.py: a run started warm from the fork server
starts its loader workers as the command itself would)."""

import multiprocessing


def cli_main():
    print(multiprocessing.get_context().get_start_method())


if __name__ == "__main__":
    cli_main()
