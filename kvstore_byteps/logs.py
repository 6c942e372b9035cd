"""Logging set-up for command-line entry points (the library itself only creates loggers)."""
import logging

from .config import Config

_LEVELS = {"TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO,
           "WARNING": logging.WARNING, "ERROR": logging.ERROR, "FATAL": logging.CRITICAL}


def setup_logging(config: Config, who: str) -> None:
    """Log to stderr at BYTEPS_LOG_LEVEL (PS_VERBOSE >= 1 lowers it to INFO, 2 to DEBUG)."""
    level = _LEVELS[config.log_level]
    if config.verbose:
        level = min(level, logging.INFO if config.verbose == 1 else logging.DEBUG)
    logging.basicConfig(level=level, format="%(asctime)s " + who + " %(levelname)s %(name)s: %(message)s")
