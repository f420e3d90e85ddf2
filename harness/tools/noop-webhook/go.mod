module gpushare.io/harness/tools/noop-webhook

go 1.22
