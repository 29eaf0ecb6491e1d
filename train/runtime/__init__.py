"""What a job runs on, whatever it trains.

    jobdir.py       the job directory: the contract between the database's owner and the worker
    distributed.py  one job as several processes under `accelerate launch`
    hardware.py     this machine's device and memory, and whether [model]'s settings run here
    memory.py       a round's expected peak memory, counted from the model's shapes
    batching.py     batches that shrink when the GPU runs out of memory
    files.py        files and directories put in place whole (standard library only: the export uses it)
"""
