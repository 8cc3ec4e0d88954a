"""Reliability guards at upstream's serving path (issue 11): the NaN guard before sampling."""
