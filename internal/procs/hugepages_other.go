//go:build !linux

package procs

import "time"

func collapseHeap(time.Duration) (HugePages, func()) {
	return HugePages{Reason: "transparent huge pages are a Linux feature"}, func() {}
}
