"""Tests of the provider pools: Strava, Garmin and the seam."""
