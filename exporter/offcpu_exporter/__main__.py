from offcpu_exporter.cli import main

raise SystemExit(main())
