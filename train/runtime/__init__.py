"""What a job runs on, whatever it trains.

    jobdir.py       the job directory: the contract between the database's owner and the worker
    distributed.py  one job as several processes under `accelerate launch`
    hardware.py     this machine's GPU or CPU, its memory, and whether it computes fast in bfloat16
    memory.py       a round's expected peak memory, counted from the model's shapes
    batching.py     batches that shrink when the GPU runs out of memory
"""
