"""Install tools: the serving certificate and the webhook configurations that register gpushare
with the apiserver. They read no pods and make no admission decision."""
