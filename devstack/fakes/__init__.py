"""Doubles of the systems we do not own: Voicy API, Cairn core, Strava, Garmin Connect, Telegram."""
