package sandbox

import (
	"reflect"
	"testing"
	"time"
)

// Clone must copy everything and share nothing: every field is filled (by
// reflection, so a field added later is filled too), and the copy must be
// equal yet hold no map, slice or pointer of the original's.
func TestCloneSharesNothing(t *testing.T) {
	var sb Sandbox
	fill(reflect.ValueOf(&sb).Elem())
	c := sb.Clone()
	if !reflect.DeepEqual(*c, sb) {
		t.Fatalf("clone differs:\n%+v\n%+v", *c, sb)
	}
	if path := shared(reflect.ValueOf(sb), reflect.ValueOf(*c), "Sandbox"); path != "" {
		t.Fatalf("the clone shares %s with the original", path)
	}
	// nil and empty maps keep their JSON (null against {}).
	empty := Sandbox{Env: map[string]string{}}
	if c := empty.Clone(); c.Env == nil || c.Metadata != nil {
		t.Fatalf("env %v metadata %v", c.Env, c.Metadata)
	}
}

func fill(v reflect.Value) {
	if v.Type() == reflect.TypeOf(time.Time{}) {
		v.Set(reflect.ValueOf(time.Unix(1, 0)))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString("x")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int64, reflect.Int32:
		v.SetInt(1)
	case reflect.Float64:
		v.SetFloat(1)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem())
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fill(v.Index(0))
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k)
		fill(e)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i))
			}
		}
	}
}

// shared names the first map, slice or pointer a and b hold in common.
func shared(a, b reflect.Value, path string) string {
	switch a.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice:
		if !a.IsNil() && a.Pointer() == b.Pointer() {
			return path
		}
	}
	switch a.Kind() {
	case reflect.Pointer:
		if !a.IsNil() {
			return shared(a.Elem(), b.Elem(), path)
		}
	case reflect.Slice:
		for i := range a.Len() {
			if p := shared(a.Index(i), b.Index(i), path+"[i]"); p != "" {
				return p
			}
		}
	case reflect.Struct:
		for i := range a.NumField() {
			if a.Type().Field(i).IsExported() {
				if p := shared(a.Field(i), b.Field(i), path+"."+a.Type().Field(i).Name); p != "" {
					return p
				}
			}
		}
	}
	return ""
}
