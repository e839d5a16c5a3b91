"""Development benchmarks, run from the repository root as modules (the checkout's bitnet_app is imported):
`python -m benchmarks.NAME`. benchmarks/README.md says which script answers which question and how long it runs.
"""
