//go:build !linux

package main

// exitWithParent needs PR_SET_PDEATHSIG, which only Linux has.
func exitWithParent() {}
