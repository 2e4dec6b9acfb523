"""The test suite: one package per op family (docs/architecture.md "Tests"); shared helpers in *_testutil.py."""
