"""Fine-tuning evaluated as the paper evaluates it: many seeds per task, the median first
(:mod:`.trials`, :mod:`.statistics`), and the files a benchmark's server scores
(:mod:`.glue_server_files`)."""
