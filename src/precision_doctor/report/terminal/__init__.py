"""Terminal renderers (rich): diagnosis, assessment, fix, audit, build log, forensics."""
