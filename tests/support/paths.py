"""Where things are, for tests in any folder."""
import os

#: the repository's root (the checkout the tests run from)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTS = os.path.join(REPO, "tests")
#: programs the cluster tests run as nodes
APPS = os.path.join(TESTS, "apps")
DATA = os.path.join(TESTS, "data")
