import sys

from frontend_proc.main import main

sys.exit(main())
