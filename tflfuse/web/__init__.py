"""tflfuse in the browser: :func:`export_web` writes a folder that ``tflfuse.js`` runs on WebGPU."""

from .export import ExportError, export_web

__all__ = ["ExportError", "export_web"]
