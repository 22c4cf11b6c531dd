"""Tests of the development doubles."""
