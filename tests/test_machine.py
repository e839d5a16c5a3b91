"""bitnet_app/machine.py: this computer's figures, read (not guessed) wherever the OS gives them (the fallbacks of
the OS readings behind them: tests/test_platform.py)."""
import os

from bitnet_app import machine


def test_memory_figures_are_read_and_consistent():
    total, free, rss = machine.total_ram(), machine.available_ram(), machine.process_rss()
    assert total > 0
    if os.path.exists("/proc/meminfo"):  # Linux: the OS says how much is free and what this process holds
        assert 0 < free <= total and 0 < rss < total


def test_the_read_roof_is_measured():
    assert 0.1 < machine.read_roof_gb_s(1) < 10000
