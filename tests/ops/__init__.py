"""Tests of the operator CLI."""
