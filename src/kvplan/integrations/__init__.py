"""Integrations with serving engines. Each submodule imports its engine lazily."""
