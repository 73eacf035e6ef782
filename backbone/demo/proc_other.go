//go:build !linux

package demo

import "syscall"

// sysProcAttr: no parent-death signal outside Linux; children are stopped
// by Stop (and by the terminal's SIGINT to the whole process group).
func sysProcAttr() *syscall.SysProcAttr { return nil }
