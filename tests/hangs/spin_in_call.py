"""hung: a thread spinning on a CPU inside one call that never returns (as NCCL spins inside
cudaStreamSynchronize, here without a GPU)."""

from _corpus import started

if __name__ == "__main__":
    started()
    any(iter(int, 1))
