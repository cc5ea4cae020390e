"""Profiles and job specs: load, validate, resolve into a request for the queue."""
