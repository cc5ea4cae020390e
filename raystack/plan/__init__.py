"""The planner: pure arithmetic over cluster shapes, models and batches (no I/O).

topology  learners and vLLM engines on nodes, as open-instruct / verl / OpenRLHF flags
memory    per-GPU memory of a ZeRO-3 learner and of a vLLM engine
batch     the gradient accumulation that keeps an effective batch on a new GPU count
"""
