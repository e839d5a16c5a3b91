"""Development benchmarks, run from the repository root as modules (the checkout's bitnet_app is imported):

    python -m benchmarks.run_benchmarks     engine speed and agreement on every kernel path (BENCHMARKS.md)
    python -m benchmarks.diffusion_vs_ar    block diffusion against AR on one model
    python -m benchmarks.sampled_decoding   whole replies, greedy and sampled, AR and diffusion: tokens/s
    python -m benchmarks.logit_rows         one block's engine call by how many logit rows it asks for
"""
