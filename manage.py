#!/usr/bin/env python
"""Django's command-line utility. `python manage.py test` runs the pytest suite."""

import os
import sys


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ttsproject.settings")
    if sys.argv[1:2] == ["serve"]:
        # daphne makes its event loop when Django loads its app: choose the loop first.
        from speech.server import eventloop

        eventloop.install()
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
