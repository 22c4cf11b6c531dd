"""Tests of the house's own rules."""
