"""Test fakes, kept out of the shipped packages."""
