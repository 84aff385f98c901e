// Decodes a tandem extender response with Go's encoding/json into structs that
// mirror k8s.io/kube-scheduler/extender/v1 (no JSON tags there either: Go matches
// the capitalised field names case-insensitively), exactly as kube-scheduler does.
// Usage: contract <filter|prioritize|bind|preempt|args|bindargs> < body.json
package main

import (
	"encoding/json"
	"fmt"
	"os"
)

type ObjectMeta struct {
	Name string `json:"name"`
	UID  string `json:"uid"`
}

type Node struct {
	Metadata ObjectMeta `json:"metadata"`
}

type NodeList struct {
	Items []Node `json:"items"`
}

type Pod struct {
	Metadata ObjectMeta `json:"metadata"`
}

type FailedNodesMap map[string]string

type ExtenderArgs struct {
	Pod       *Pod
	Nodes     *NodeList
	NodeNames *[]string
}

type ExtenderFilterResult struct {
	Nodes                      *NodeList
	NodeNames                  *[]string
	FailedNodes                FailedNodesMap
	FailedAndUnresolvableNodes FailedNodesMap
	Error                      string
}

type HostPriority struct {
	Host  string
	Score int64
}

type HostPriorityList []HostPriority

type ExtenderBindingArgs struct {
	PodName      string
	PodNamespace string
	PodUID       string
	Node         string
}

type ExtenderBindingResult struct {
	Error string
}

type MetaPod struct {
	UID string
}

type MetaVictims struct {
	Pods             []*MetaPod
	NumPDBViolations int64
}

type ExtenderPreemptionResult struct {
	NodeNameToMetaVictims map[string]*MetaVictims
}

func main() {
	var target interface{}
	switch os.Args[1] {
	case "filter":
		target = &ExtenderFilterResult{}
	case "prioritize":
		target = &HostPriorityList{}
	case "bind":
		target = &ExtenderBindingResult{}
	case "preempt":
		target = &ExtenderPreemptionResult{}
	case "args":
		target = &ExtenderArgs{}
	case "bindargs":
		target = &ExtenderBindingArgs{}
	default:
		fmt.Fprintln(os.Stderr, "unknown type", os.Args[1])
		os.Exit(2)
	}
	if err := json.NewDecoder(os.Stdin).Decode(target); err != nil {
		fmt.Fprintln(os.Stderr, "decode error:", err)
		os.Exit(1)
	}
	out, _ := json.Marshal(target)
	fmt.Println(string(out))
}
