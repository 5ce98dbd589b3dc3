"""The folder put first on PYTHONPATH by ``skewlens profile``; a package only so that wheels ship it."""
