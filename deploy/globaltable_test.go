package deploy_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	yamlv3 "go.yaml.in/yaml/v3"

	"github.com/hotcount/hotcount/schema"
)

// cfnTemplate is a CloudFormation template as far as the tests read one;
// decoded with known fields only, so a misspelt section or key fails.
type cfnTemplate struct {
	AWSTemplateFormatVersion string `yaml:"AWSTemplateFormatVersion"`
	Description              string `yaml:"Description"`
	Parameters               map[string]struct {
		Type                  string `yaml:"Type"`
		Default               string `yaml:"Default"`
		Description           string `yaml:"Description"`
		AllowedPattern        string `yaml:"AllowedPattern"`
		ConstraintDescription string `yaml:"ConstraintDescription"`
	} `yaml:"Parameters"`
	Rules map[string]struct {
		RuleCondition yamlv3.Node `yaml:"RuleCondition"` // Kind 0: none
		Assertions    []struct {
			Assert            yamlv3.Node `yaml:"Assert"`
			AssertDescription string      `yaml:"AssertDescription"`
		} `yaml:"Assertions"`
	} `yaml:"Rules"`
	Conditions map[string]yamlv3.Node `yaml:"Conditions"`
	Resources  map[string]struct {
		Type                string      `yaml:"Type"`
		Condition           string      `yaml:"Condition"`
		DeletionPolicy      string      `yaml:"DeletionPolicy"`
		UpdateReplacePolicy string      `yaml:"UpdateReplacePolicy"`
		Properties          yamlv3.Node `yaml:"Properties"`
	} `yaml:"Resources"`
	Outputs map[string]struct {
		Condition   string      `yaml:"Condition"`
		Description string      `yaml:"Description"`
		Value       yamlv3.Node `yaml:"Value"`
	} `yaml:"Outputs"`
}

func readTemplate(t *testing.T, path string) cfnTemplate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var tmpl cfnTemplate
	dec := yamlv3.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&tmpl); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if tmpl.AWSTemplateFormatVersion != "2010-09-09" {
		t.Errorf("%s: AWSTemplateFormatVersion %q", path, tmpl.AWSTemplateFormatVersion)
	}
	return tmpl
}

// stack is a template deployed with given parameters in a given Region, as
// far as these tests need CloudFormation: the intrinsic functions the
// templates use are evaluated (an unknown one, an unknown reference or
// condition fails), AWS::NoValue drops what it stands for, and the result
// is plain values.
type stack struct {
	tmpl   cfnTemplate
	params map[string]string
	pseudo map[string]string
}

const testAccount = "123456789012"

func deploy(t *testing.T, tmpl cfnTemplate, region string, overrides map[string]string) *stack {
	t.Helper()
	s := &stack{tmpl: tmpl, params: map[string]string{}, pseudo: map[string]string{
		"AWS::Region": region, "AWS::AccountId": testAccount, "AWS::Partition": "aws",
	}}
	for name, p := range tmpl.Parameters {
		if p.Type != "String" {
			t.Fatalf("parameter %s of type %s: the tests know String only", name, p.Type)
		}
		s.params[name] = p.Default
	}
	for name, v := range overrides {
		if _, ok := tmpl.Parameters[name]; !ok {
			t.Fatalf("no parameter %s", name)
		}
		s.params[name] = v
	}
	return s
}

// errNoValue is AWS::NoValue: the value is absent.
var errNoValue = errors.New("AWS::NoValue")

func (s *stack) ref(name string) (any, error) {
	if name == "AWS::NoValue" {
		return nil, errNoValue
	}
	if v, ok := s.pseudo[name]; ok {
		return v, nil
	}
	if v, ok := s.params[name]; ok {
		return v, nil
	}
	if r, ok := s.tmpl.Resources[name]; ok && strings.HasPrefix(r.Type, "AWS::DynamoDB::") {
		return s.tableName(name) // Ref of a table is its name
	}
	return nil, fmt.Errorf("Ref to unknown %q", name)
}

func (s *stack) tableName(logical string) (string, error) {
	r := s.tmpl.Resources[logical]
	props, err := s.eval(&r.Properties)
	if err != nil {
		return "", err
	}
	name, _ := props.(map[string]any)["TableName"].(string)
	if name == "" {
		return "", fmt.Errorf("%s has no TableName", logical)
	}
	return name, nil
}

func (s *stack) getAtt(target string) (any, error) {
	logical, attr, _ := strings.Cut(target, ".")
	r, ok := s.tmpl.Resources[logical]
	if !ok || attr != "Arn" || !strings.HasPrefix(r.Type, "AWS::DynamoDB::") {
		return nil, fmt.Errorf("GetAtt %s: the tests know a table's Arn only", target)
	}
	name, err := s.tableName(logical)
	if err != nil {
		return nil, err
	}
	// A table's Arn, and a global table's: the replica in the stack's
	// Region.
	return fmt.Sprintf("arn:%s:dynamodb:%s:%s:table/%s", s.pseudo["AWS::Partition"], s.pseudo["AWS::Region"], s.pseudo["AWS::AccountId"], name), nil
}

var subVar = regexp.MustCompile(`\$\{([^}!]+)\}`)

func (s *stack) sub(format string) (any, error) {
	var err error
	out := subVar.ReplaceAllStringFunc(format, func(m string) string {
		name := m[2 : len(m)-1]
		var v any
		var e error
		if strings.Contains(name, ".") {
			v, e = s.getAtt(name)
		} else {
			v, e = s.ref(name)
		}
		if e != nil {
			err = errors.Join(err, e)
			return ""
		}
		return fmt.Sprint(v)
	})
	return out, err
}

func (s *stack) condition(name string) (bool, error) {
	n, ok := s.tmpl.Conditions[name]
	if !ok {
		return false, fmt.Errorf("unknown condition %q", name)
	}
	v, err := s.eval(&n)
	if err != nil {
		return false, fmt.Errorf("condition %s: %w", name, err)
	}
	b, ok := v.(bool)
	if !ok {
		return false, fmt.Errorf("condition %s is %v, not a boolean", name, v)
	}
	return b, nil
}

func (s *stack) evalBool(n *yamlv3.Node) (bool, error) {
	v, err := s.eval(n)
	if err != nil {
		return false, err
	}
	b, ok := v.(bool)
	if !ok {
		return false, fmt.Errorf("line %d: %v is not a boolean", n.Line, v)
	}
	return b, nil
}

// eval evaluates a node, short (!Ref) or long (Ref:, Fn::If:) forms alike.
func (s *stack) eval(n *yamlv3.Node) (any, error) {
	switch n.Kind {
	case yamlv3.DocumentNode:
		return s.eval(n.Content[0])
	case yamlv3.AliasNode:
		return s.eval(n.Alias)
	case yamlv3.MappingNode:
		if len(n.Content) == 2 && n.ShortTag() == "!!map" && (n.Content[0].Value == "Ref" || n.Content[0].Value == "Condition" || strings.HasPrefix(n.Content[0].Value, "Fn::")) {
			return s.fn(strings.TrimPrefix(n.Content[0].Value, "Fn::"), n.Content[1])
		}
		if n.ShortTag() != "!!map" {
			return nil, fmt.Errorf("line %d: unknown %s on a mapping", n.Line, n.ShortTag())
		}
		m := map[string]any{}
		for i := 0; i < len(n.Content); i += 2 {
			v, err := s.eval(n.Content[i+1])
			if errors.Is(err, errNoValue) {
				continue
			}
			if err != nil {
				return nil, err
			}
			m[n.Content[i].Value] = v
		}
		return m, nil
	}
	if tag := n.ShortTag(); strings.HasPrefix(tag, "!") && !strings.HasPrefix(tag, "!!") {
		arg := *n // the argument: the node untagged
		if n.Kind == yamlv3.SequenceNode {
			arg.Tag = "!!seq"
		} else {
			arg.Tag = "!!str"
		}
		return s.fn(tag[1:], &arg)
	}
	if n.Kind == yamlv3.SequenceNode {
		var l []any
		for _, c := range n.Content {
			v, err := s.eval(c)
			if errors.Is(err, errNoValue) {
				continue // an item that is AWS::NoValue is no item
			}
			if err != nil {
				return nil, err
			}
			l = append(l, v)
		}
		return l, nil
	}
	var v any
	if err := n.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

// fn applies an intrinsic function (name without "Fn::") to its argument.
func (s *stack) fn(name string, arg *yamlv3.Node) (any, error) {
	args := func(want int) ([]*yamlv3.Node, error) {
		if arg.Kind != yamlv3.SequenceNode || len(arg.Content) != want {
			return nil, fmt.Errorf("line %d: %s takes a list of %d", arg.Line, name, want)
		}
		return arg.Content, nil
	}
	switch name {
	case "Ref":
		return s.ref(arg.Value)
	case "Sub":
		if arg.Kind != yamlv3.ScalarNode {
			return nil, fmt.Errorf("line %d: the tests know Sub of a string only", arg.Line)
		}
		return s.sub(arg.Value)
	case "GetAtt":
		if arg.Kind == yamlv3.SequenceNode && len(arg.Content) == 2 {
			return s.getAtt(arg.Content[0].Value + "." + arg.Content[1].Value)
		}
		return s.getAtt(arg.Value)
	case "Condition":
		return s.condition(arg.Value)
	case "If":
		a, err := args(3)
		if err != nil {
			return nil, err
		}
		c, err := s.condition(a[0].Value)
		if err != nil {
			return nil, err
		}
		if c {
			return s.eval(a[1])
		}
		return s.eval(a[2])
	case "Equals":
		a, err := args(2)
		if err != nil {
			return nil, err
		}
		x, err := s.eval(a[0])
		if err != nil {
			return nil, err
		}
		y, err := s.eval(a[1])
		if err != nil {
			return nil, err
		}
		return fmt.Sprint(x) == fmt.Sprint(y), nil
	case "Not":
		a, err := args(1)
		if err != nil {
			return nil, err
		}
		b, err := s.evalBool(a[0])
		return !b, err
	case "And", "Or":
		if arg.Kind != yamlv3.SequenceNode || len(arg.Content) < 2 {
			return nil, fmt.Errorf("line %d: %s takes a list of 2 or more", arg.Line, name)
		}
		all := name == "And"
		for _, c := range arg.Content {
			b, err := s.evalBool(c)
			if err != nil {
				return nil, err
			}
			if b != all {
				return !all, nil
			}
		}
		return all, nil
	}
	return nil, fmt.Errorf("line %d: unknown function %s", arg.Line, name)
}

// resource evaluates a resource's properties and decodes them strictly
// (JSON field names, unknown ones refused) into into.
func (s *stack) resource(t *testing.T, logical string, into any) {
	t.Helper()
	r, ok := s.tmpl.Resources[logical]
	if !ok {
		t.Fatalf("no resource %s", logical)
	}
	v, err := s.eval(&r.Properties)
	if err != nil {
		t.Fatalf("%s: %v", logical, err)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		t.Fatalf("%s's properties: %v\n%s", logical, err, b)
	}
}

// outputs returns the stack's outputs whose condition holds.
func (s *stack) outputs(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for name, o := range s.tmpl.Outputs {
		if o.Condition != "" {
			c, err := s.condition(o.Condition)
			if err != nil {
				t.Fatalf("output %s: %v", name, err)
			}
			if !c {
				continue
			}
		}
		v, err := s.eval(&o.Value)
		if err != nil {
			t.Fatalf("output %s: %v", name, err)
		}
		out[name] = fmt.Sprint(v)
	}
	return out
}

// validate is what CloudFormation checks before it starts: each
// parameter's AllowedPattern, then the Rules' assertions.
func (s *stack) validate() error {
	for name, p := range s.tmpl.Parameters {
		if p.AllowedPattern == "" {
			continue
		}
		// CloudFormation matches the whole value.
		if !regexp.MustCompile("^(?:" + p.AllowedPattern + ")$").MatchString(s.params[name]) {
			return fmt.Errorf("parameter %s = %q: %s", name, s.params[name], p.ConstraintDescription)
		}
	}
	for name, r := range s.tmpl.Rules {
		if r.RuleCondition.Kind != 0 {
			applies, err := s.evalBool(&r.RuleCondition)
			if err != nil {
				return fmt.Errorf("rule %s: %w", name, err)
			}
			if !applies {
				continue
			}
		}
		for _, a := range r.Assertions {
			ok, err := s.evalBool(&a.Assert)
			if err != nil {
				return fmt.Errorf("rule %s: %w", name, err)
			}
			if !ok {
				return fmt.Errorf("rule %s: %s", name, a.AssertDescription)
			}
		}
	}
	return nil
}

type attributeDefinition struct {
	AttributeName string
	AttributeType string
}

type keySchemaElement struct {
	AttributeName string
	KeyType       string
}

type ttlSpecification struct {
	AttributeName string
	Enabled       bool
}

type pitrSpecification struct {
	PointInTimeRecoveryEnabled bool
}

type sseSpecification struct {
	SSEEnabled bool
	SSEType    string `json:",omitempty"`
}

// tableProperties: the AWS::DynamoDB::Table properties the single-Region
// template may set.
type tableProperties struct {
	TableName                        string
	AttributeDefinitions             []attributeDefinition
	KeySchema                        []keySchemaElement
	BillingMode                      string
	TimeToLiveSpecification          *ttlSpecification
	PointInTimeRecoverySpecification *pitrSpecification
	SSESpecification                 *sseSpecification
}

// globalTableProperties: the AWS::DynamoDB::GlobalTable properties the
// global template may set (names as in CloudFormation's reference).
type globalTableProperties struct {
	TableName               string
	MultiRegionConsistency  string
	AttributeDefinitions    []attributeDefinition
	KeySchema               []keySchemaElement
	BillingMode             string
	StreamSpecification     *struct{ StreamViewType string }
	TimeToLiveSpecification *ttlSpecification
	SSESpecification        *sseSpecification
	Replicas                []struct {
		Region                           string
		PointInTimeRecoverySpecification *pitrSpecification
		DeletionProtectionEnabled        *bool
	}
}

// TestGlobalTableTemplate deploys table/global-table.yaml, as the tests'
// CloudFormation, with one, two and three Regions: it is a global table
// with the single-Region table's key, billing, TTL, encryption and
// point-in-time recovery (on every replica), a stream with both images,
// last writer wins between Regions, exactly the Regions given as replicas
// (the stack's own first), retained on delete, and its outputs are each
// replica's ARN, the shape deploy/iam/policy.json takes.
func TestGlobalTableTemplate(t *testing.T) {
	single := readTemplate(t, "table/cloudformation.yaml")
	global := readTemplate(t, "table/global-table.yaml")

	const home = "eu-west-1"
	var one tableProperties
	deploy(t, single, home, nil).resource(t, "Table", &one)
	st, gt := single.Resources["Table"], global.Resources["Table"]
	if gt.Type != "AWS::DynamoDB::GlobalTable" {
		t.Fatalf("resource Table is a %s, want AWS::DynamoDB::GlobalTable", gt.Type)
	}
	if gt.DeletionPolicy != "Retain" || gt.UpdateReplacePolicy != "Retain" || gt.DeletionPolicy != st.DeletionPolicy || gt.UpdateReplacePolicy != st.UpdateReplacePolicy {
		t.Errorf("deletion %q, replacement %q: want Retain, as the single-Region table", gt.DeletionPolicy, gt.UpdateReplacePolicy)
	}
	if len(global.Resources) != 1 {
		t.Errorf("%d resources, want the table only", len(global.Resources))
	}
	policyARN := readPolicy(t, "iam/policy.json").Statement[0].Resource

	for _, tc := range []struct {
		params  map[string]string
		regions []string
	}{
		{nil, []string{home}},
		{map[string]string{"SecondRegion": "us-east-1"}, []string{home, "us-east-1"}},
		{map[string]string{"SecondRegion": "us-east-1", "ThirdRegion": "ap-southeast-2"}, []string{home, "us-east-1", "ap-southeast-2"}},
		{map[string]string{"ThirdRegion": "eu-central-1"}, []string{home, "eu-central-1"}},
	} {
		t.Run(strings.Join(tc.regions, ","), func(t *testing.T) {
			s := deploy(t, global, home, tc.params)
			if err := s.validate(); err != nil {
				t.Fatalf("CloudFormation would refuse the parameters: %v", err)
			}
			var p globalTableProperties
			s.resource(t, "Table", &p)

			if !reflect.DeepEqual(p.KeySchema, one.KeySchema) || len(p.KeySchema) != 1 || p.KeySchema[0] != (keySchemaElement{schema.AttrPK, "HASH"}) {
				t.Errorf("key schema %+v, want the single-Region table's, %+v (%s HASH only)", p.KeySchema, one.KeySchema, schema.AttrPK)
			}
			if !reflect.DeepEqual(p.AttributeDefinitions, one.AttributeDefinitions) || len(p.AttributeDefinitions) != 1 || p.AttributeDefinitions[0] != (attributeDefinition{schema.AttrPK, "S"}) {
				t.Errorf("attributes %+v, want the single-Region table's, %+v (%s of type S only)", p.AttributeDefinitions, one.AttributeDefinitions, schema.AttrPK)
			}
			if p.TableName != one.TableName || p.TableName != "hotcount" {
				t.Errorf("table name %q, want the single-Region table's default %q", p.TableName, one.TableName)
			}
			if p.BillingMode != "PAY_PER_REQUEST" || p.BillingMode != one.BillingMode {
				t.Errorf("billing %q, want PAY_PER_REQUEST (on-demand), as the single-Region table (%q)", p.BillingMode, one.BillingMode)
			}
			if p.TimeToLiveSpecification == nil || *p.TimeToLiveSpecification != (ttlSpecification{schema.AttrExpiresAt, true}) || one.TimeToLiveSpecification == nil || *p.TimeToLiveSpecification != *one.TimeToLiveSpecification {
				t.Errorf("TTL %+v, want enabled on %s, as the single-Region table (%+v)", p.TimeToLiveSpecification, schema.AttrExpiresAt, one.TimeToLiveSpecification)
			}
			if p.SSESpecification == nil || one.SSESpecification == nil || p.SSESpecification.SSEEnabled != one.SSESpecification.SSEEnabled {
				t.Errorf("encryption %+v, want the single-Region table's %+v", p.SSESpecification, one.SSESpecification)
			}
			// AWS requires the stream for more than one replica and
			// refuses to change it then: it is there from the first.
			if p.StreamSpecification == nil || p.StreamSpecification.StreamViewType != "NEW_AND_OLD_IMAGES" {
				t.Errorf("stream %+v, want NEW_AND_OLD_IMAGES", p.StreamSpecification)
			}
			// hotcount's Region-owned shards are made for MREC; MRSC
			// (STRONG) is another table, with its own limits.
			if p.MultiRegionConsistency != "" && p.MultiRegionConsistency != "EVENTUAL" {
				t.Errorf("MultiRegionConsistency %q, want EVENTUAL (the default)", p.MultiRegionConsistency)
			}

			var regions []string
			for _, r := range p.Replicas {
				regions = append(regions, r.Region)
				if r.PointInTimeRecoverySpecification == nil || one.PointInTimeRecoverySpecification == nil ||
					!r.PointInTimeRecoverySpecification.PointInTimeRecoveryEnabled || !one.PointInTimeRecoverySpecification.PointInTimeRecoveryEnabled {
					t.Errorf("replica %s: point-in-time recovery %+v, want it enabled as on the single-Region table", r.Region, r.PointInTimeRecoverySpecification)
				}
			}
			if !slices.Equal(regions, tc.regions) {
				t.Errorf("replicas in %v, want %v (the stack's Region first, then those given, each once)", regions, tc.regions)
			}

			// One output per replica, its ARN; each is policy.json's
			// resource with the Region and account filled in.
			outs := s.outputs(t)
			var arns []string
			for _, v := range outs {
				arns = append(arns, v)
			}
			var want []string
			for _, r := range tc.regions {
				arn := fmt.Sprintf("arn:aws:dynamodb:%s:%s:table/%s", r, testAccount, p.TableName)
				want = append(want, arn)
				if filled := strings.NewReplacer("REGION", r, "ACCOUNT_ID", testAccount).Replace(policyARN); filled != arn {
					t.Errorf("policy.json's resource %s, filled in for %s, is %s: want the replica's ARN %s", policyARN, r, filled, arn)
				}
			}
			slices.Sort(arns)
			slices.Sort(want)
			if !slices.Equal(arns, want) {
				t.Errorf("outputs %v, want each replica's ARN once: %v", outs, want)
			}
			if outs["TableArn"] != fmt.Sprintf("arn:aws:dynamodb:%s:%s:table/%s", home, testAccount, p.TableName) {
				t.Errorf("TableArn %q, want the stack Region's replica", outs["TableArn"])
			}
		})
	}

	// What CloudFormation must refuse before it creates anything.
	for _, bad := range []map[string]string{
		{"SecondRegion": "us-east-1", "ThirdRegion": "us-east-1"},
		{"SecondRegion": "us-east-1,eu-central-1"},
		{"SecondRegion": "US-EAST-1"},
		{"ThirdRegion": " eu-central-1"},
	} {
		if err := deploy(t, global, home, bad).validate(); err == nil {
			t.Errorf("parameters %v accepted, want them refused", bad)
		}
	}
}

// TestTemplateEvaluator: the tests' CloudFormation fails a template it
// cannot evaluate (else a typo would pass as an absent value).
func TestTemplateEvaluator(t *testing.T) {
	for _, src := range []string{
		"Resources: {Table: {Type: AWS::DynamoDB::Table, Properties: {TableName: !Iff [C, a, b]}}}",
		"Resources: {Table: {Type: AWS::DynamoDB::Table, Properties: {TableName: !If [Missing, a, b]}}}",
		"Resources: {Table: {Type: AWS::DynamoDB::Table, Properties: {TableName: !Ref Missing}}}",
		"Resources: {Table: {Type: AWS::DynamoDB::Table, Properties: {TableName: !Sub 'x-${Missing}'}}}",
	} {
		var tmpl cfnTemplate
		if err := yamlv3.Unmarshal([]byte(src), &tmpl); err != nil {
			t.Fatal(err)
		}
		r := tmpl.Resources["Table"]
		if _, err := deploy(t, tmpl, "eu-west-1", nil).eval(&r.Properties); err == nil {
			t.Errorf("%s: evaluated without an error", src)
		}
	}
	var tmpl cfnTemplate
	src := `Parameters: {P: {Type: String, Default: ""}}
Conditions: {HasP: !Not [!Equals [!Ref P, ""]]}
Resources: {Table: {Type: AWS::DynamoDB::Table, Properties: {TableName: t, L: [a, !If [HasP, !Ref P, !Ref AWS::NoValue]], M: {"Fn::If": [HasP, x, y]}}}}`
	if err := yamlv3.Unmarshal([]byte(src), &tmpl); err != nil {
		t.Fatal(err)
	}
	r := tmpl.Resources["Table"]
	for p, want := range map[string]string{"": "map[L:[a] M:y TableName:t]", "b": "map[L:[a b] M:x TableName:t]"} {
		v, err := deploy(t, tmpl, "eu-west-1", map[string]string{"P": p}).eval(&r.Properties)
		if err != nil || fmt.Sprint(v) != want {
			t.Errorf("P=%q: %v, %v; want %s", p, v, err, want)
		}
	}
}

// TestIAMPolicyPerRegion: the sidecar's policy names one table in one
// Region (a global table's replica is a table of its own, with its
// Region's ARN, and a sidecar calls its own Region only), and lets it read
// the replicas with DescribeTable.
func TestIAMPolicyPerRegion(t *testing.T) {
	p := readPolicy(t, "iam/policy.json")
	if len(p.Statement) != 1 {
		t.Fatalf("%d statements, want one, on the table", len(p.Statement))
	}
	s := p.Statement[0]
	f := strings.Split(s.Resource, ":")
	if len(f) != 6 || f[0] != "arn" || f[1] != "aws" || f[2] != "dynamodb" || f[3] != "REGION" || f[4] != "ACCOUNT_ID" || f[5] != "table/hotcount" {
		t.Errorf("resource %s, want arn:aws:dynamodb:REGION:ACCOUNT_ID:table/hotcount (one Region, the table only)", s.Resource)
	}
	if !slices.Contains(s.Action, "dynamodb:DescribeTable") {
		t.Errorf("actions %v lack dynamodb:DescribeTable: a sidecar reads a global table's replicas with it", s.Action)
	}
}
