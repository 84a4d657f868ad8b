"""Terminal output (rich): the renderers of diagnosis, assessment, fix, audit, build log and
forensics; tables that stay readable at any width (``tables``); the progress bar (``progress``)."""
