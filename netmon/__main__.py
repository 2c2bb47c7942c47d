from netmon.cli.main import main

raise SystemExit(main())
