"""Loads a script of bench/ as a module, for the CPU tests of its pure parts (saving, tables, the
performance page); the scripts import each other, so bench/ goes on sys.path first."""
import importlib.util
import os
import sys

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")


def load(name):
    if BENCH not in sys.path:
        sys.path.insert(0, BENCH)
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCH, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
