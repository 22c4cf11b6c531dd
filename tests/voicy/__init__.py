"""Tests of the Voicy side: pipeline, leases, media."""
