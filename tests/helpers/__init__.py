"""Plain helpers the test modules share (stand-ins, recorded device facts, model and bundle
builders). Fixtures built from them live in tests/conftest.py; no test module imports another."""
