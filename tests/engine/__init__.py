"""Tests of the transcription engines."""
